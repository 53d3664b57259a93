//! Namespace names: interned while they hold something, forgotten once they hold nothing.
//!
//! A name is interned when a sequence of it is admitted and kept while it has a live sequence or a
//! node in the tree (pins are on nodes). Ids are never reused, so a forgotten name cannot alias
//! a new one; a refused call or a lookup under an unknown name interns nothing.

use super::{State, PUBLIC_NAMESPACE_NAME};
use crate::keys::KeyNamespace;
use crate::radix::{Namespace, DEFAULT_NAMESPACE, PUBLIC_NAMESPACE};

/// Stands for a namespace name never used to cache anything: it owns no node.
pub(crate) const UNSEEN_NAMESPACE: Namespace = u64::MAX - 1;

impl State {
    /// Intern a namespace name not known yet.
    pub(super) fn intern(&mut self, name: &str) -> Namespace {
        let ns = self.next_namespace;
        self.next_namespace += 1;
        self.namespaces.insert(name.to_owned(), ns);
        self.namespace_names.insert(ns, name.to_owned());
        if !self.tenant_floors.is_empty() {
            let quotas: Vec<(Option<usize>, super::TenantQuota)> = self
                .tenant_floors
                .iter()
                .filter(|((n, _), _)| n.as_deref() == Some(name))
                .map(|(&(_, t), &q)| (t, q))
                .collect();
            for (t, (floor, ceiling)) in quotas {
                // A fresh id holds nothing yet: the quota starts at 0 cached pages.
                let tree = self.floor_tree(t);
                let set =
                    tree.set_floor(ns, floor).is_ok() && tree.set_ceiling(ns, ceiling).is_ok();
                debug_assert!(set, "a named namespace is never the public one");
            }
        }
        ns
    }

    /// The tree a floor applies to: HBM's (`None`) or lower tier `t`'s.
    pub(super) fn floor_tree(&mut self, t: Option<usize>) -> &mut crate::radix::RadixTree {
        match t {
            None => &mut self.tree,
            Some(i) => &mut self.tiers[i].tree,
        }
    }

    /// A live sequence of `ns` was added.
    pub(super) fn add_live(&mut self, ns: Namespace) {
        if self.namespace_names.contains_key(&ns) {
            *self.namespace_seqs.entry(ns).or_default() += 1;
        }
    }

    /// A live sequence of `ns` was removed.
    pub(super) fn remove_live(&mut self, ns: Namespace) {
        if let Some(n) = self.namespace_seqs.get_mut(&ns) {
            *n -= 1;
            if *n == 0 {
                self.namespace_seqs.remove(&ns);
            }
        }
        self.forget_if_unused(ns);
    }

    /// Forget `ns`'s name once it has no live sequence and no cached page (pins are on cached
    /// pages): a namespace that holds nothing costs nothing.
    pub(super) fn forget_if_unused(&mut self, ns: Namespace) {
        if self.namespace_seqs.contains_key(&ns)
            || self.tree.num_namespace_nodes(ns) > 0
            || self.groups.holds_namespace(ns)
            || self
                .tiers
                .iter()
                .any(|t| t.tree.num_namespace_nodes(ns) > 0)
        {
            return;
        }
        if let Some(name) = self.namespace_names.remove(&ns) {
            self.namespaces.remove(&name);
            // The name's floors wait for its next id (removing one never fails).
            let mut removed =
                self.tree.set_floor(ns, 0).is_ok() && self.tree.set_ceiling(ns, None).is_ok();
            for t in &mut self.tiers {
                removed &= t.tree.set_floor(ns, 0).is_ok() && t.tree.set_ceiling(ns, None).is_ok();
            }
            debug_assert!(removed);
        }
    }

    /// The id of a namespace name, interning it if it is new (`known`: its
    /// [`known_namespace`](Self::known_namespace), looked up earlier under the same lock).
    pub(super) fn resolve_namespace(
        &mut self,
        known: Option<Namespace>,
        name: Option<&str>,
    ) -> Namespace {
        match (known, name) {
            (Some(ns), _) => ns,
            (None, Some(name)) => self.intern(name),
            (None, None) => DEFAULT_NAMESPACE,
        }
    }

    /// The id of a namespace name, without interning a new one.
    pub(super) fn known_namespace(&self, name: Option<&str>) -> Option<Namespace> {
        match name {
            None => Some(DEFAULT_NAMESPACE),
            Some(PUBLIC_NAMESPACE_NAME) => Some(PUBLIC_NAMESPACE),
            Some(name) => self.namespaces.get(name).copied(),
        }
    }

    /// How page keys name `ns`: the default, the public one, or an interned name (`None` for an
    /// id with no name, which a live sequence never has).
    pub(super) fn key_namespace(&self, ns: Namespace) -> Option<KeyNamespace<'_>> {
        match ns {
            DEFAULT_NAMESPACE => Some(KeyNamespace::Default),
            PUBLIC_NAMESPACE => Some(KeyNamespace::Public),
            ns => self
                .namespace_names
                .get(&ns)
                .map(|name| KeyNamespace::Named(name)),
        }
    }
}
