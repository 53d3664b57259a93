//! KV events for routers (vLLM's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`): what entered
//! and what left the cache, in order, with the page keys of [`crate::keys`], so that a KV-aware
//! router (llm-d, Dynamo) can index kvcore instances. Off by default; when off the only cost is
//! one branch where pages enter or leave the tree.
//!
//! A cached page's key chains over the path that holds it: each page is hashed in the namespace
//! of the tree node it sits in (a public prefix under `"*"`, a tenant's pages under its name), from
//! the key of the page before it on the path (the cache's root key for the first page).

use std::collections::HashMap;

use super::{internal, KVCacheManager, State};
use crate::error::KvResult;
use crate::keys::{page_key, KeyNamespace, PageKey};
use crate::radix::{Namespace, NodeId};
use crate::PageId;

/// The medium the pages of this manager live in.
pub const MEDIUM_HBM: &str = "hbm";

/// One change of the cache's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Pages entered the cache: `keys[i]` is `pages[i]`'s key; `parent` the key of the page before
    /// the first one (`None`: they start at the root); `namespace` their namespace (`None` the
    /// default one, `"*"` the public one).
    Stored {
        keys: Vec<PageKey>,
        parent: Option<PageKey>,
        namespace: Option<String>,
        /// HBM page ids, or slots for a lower tier.
        pages: Vec<PageId>,
        /// [`MEDIUM_HBM`] or a lower tier's name.
        medium: String,
        /// The pages' token ids, `[keys.len() * page_size]` (vLLM's `token_ids`).
        tokens: Vec<u32>,
    },
    /// Pages left the cache (evicted, or dropped by a reset), or a lower tier.
    Removed {
        keys: Vec<PageKey>,
        pages: Vec<PageId>,
        medium: String,
    },
    /// Nothing is cached in `medium` any more: HBM after a reset that left no page; every medium
    /// in turn at the start of a snapshot (see [`KVCacheManager::take_events`]).
    AllCleared { medium: String },
}

/// Events the log holds at most between two [`KVCacheManager::take_events`] calls (some 60 MB at
/// worst: about 500 bytes an event, measured).
/// Past it the log is dropped and the next call returns the cache's whole content instead.
pub const MAX_EVENTS: usize = 1 << 17;

/// What a snapshot needs of a windowed primary group's cached page (no tree node holds it).
#[derive(Debug)]
struct GroupPage {
    /// Insertion order: parents before their children.
    order: u64,
    parent: Option<PageKey>,
    namespace: Option<String>,
    tokens: Vec<u32>,
}

/// The event log and the key of every cached page (only while events are on).
#[derive(Debug, Default)]
pub(super) struct Events {
    log: Vec<KvEvent>,
    key_of: HashMap<PageId, PageKey>,
    /// The cached pages of a windowed primary group (every group windowed).
    group_pages: HashMap<PageId, GroupPage>,
    next_group_order: u64,
    /// The log overflowed since the last take: it holds nothing, and the next take is a snapshot.
    overflowed: bool,
    /// Events dropped by overflows, ever.
    dropped: u64,
}

impl Events {
    /// Append `event`, unless the log is full: then it is dropped with the log (a consumer that
    /// stops taking events must not grow the manager's memory without bound), and the next
    /// [`KVCacheManager::take_events`] returns a snapshot that replaces them.
    pub(super) fn push(&mut self, event: KvEvent) {
        if self.overflowed {
            self.dropped += 1;
        } else if self.log.len() >= MAX_EVENTS {
            self.dropped += self.log.len() as u64 + 1;
            self.log = Vec::new();
            self.overflowed = true;
        } else {
            self.log.push(event);
        }
    }
}

impl KVCacheManager {
    /// The events since the last call, in order (empty when events are off).
    ///
    /// If more than [`MAX_EVENTS`] events were recorded since the last call, they were dropped,
    /// and this call returns instead, for HBM then each lower tier, `AllCleared` of that medium
    /// followed by `Stored` events of everything it holds now, parents before children: a consumer that
    /// applies it as any other events ends with the cache's exact content. In such a snapshot a
    /// page's parent is the key of the page before it on its medium's path.
    pub fn take_events(&self) -> Vec<KvEvent> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let Some(events) = st.events.as_mut() else {
            return Vec::new();
        };
        if !events.overflowed {
            return std::mem::take(&mut events.log);
        }
        events.overflowed = false;
        let st = &*st;
        let mut out = vec![KvEvent::AllCleared {
            medium: MEDIUM_HBM.to_owned(),
        }];
        let key_of = st.events.as_ref().map(|e| &e.key_of);
        let key = |p: &PageId| key_of.and_then(|k| k.get(p).copied());
        for (_, parent, ns, pages, tokens) in st.tree.nodes_by_depth() {
            let keys: Vec<PageKey> = pages.iter().filter_map(key).collect();
            if keys.len() != pages.len() {
                continue; // not possible while events are on (every cached page has its key)
            }
            let parent_key = st.tree.last_page(parent).and_then(|p| key(&p));
            out.push(KvEvent::Stored {
                keys,
                parent: parent_key,
                namespace: st.namespace_label(ns),
                pages: pages.to_vec(),
                medium: MEDIUM_HBM.to_owned(),
                tokens: tokens.to_vec(),
            });
        }
        if let Some(events) = st.events.as_ref() {
            let mut group: Vec<(&PageId, &GroupPage)> = events.group_pages.iter().collect();
            group.sort_unstable_by_key(|(_, g)| g.order);
            for (&page, g) in group {
                if let Some(&k) = events.key_of.get(&page) {
                    out.push(KvEvent::Stored {
                        keys: vec![k],
                        parent: g.parent,
                        namespace: g.namespace.clone(),
                        pages: vec![page],
                        medium: MEDIUM_HBM.to_owned(),
                        tokens: g.tokens.clone(),
                    });
                }
            }
        }
        for tier in &st.tiers {
            tier.snapshot_events(|ns| st.namespace_label(ns), &mut out);
        }
        out
    }

    /// Put back the events of a [`take_events`](Self::take_events) call whose caller could not
    /// take them (an exception while they were converted): they come first in the next call,
    /// before what was recorded since. If the log overflowed meanwhile, the next call's snapshot
    /// covers them (they count as dropped).
    pub fn restore_events(&self, taken: Vec<KvEvent>) {
        if taken.is_empty() {
            return;
        }
        let mut guard = self.state.lock();
        let Some(events) = guard.events.as_mut() else {
            return;
        };
        if events.overflowed {
            events.dropped += taken.len() as u64;
            return;
        }
        let mut log = taken;
        log.append(&mut events.log);
        if log.len() > MAX_EVENTS {
            events.dropped += log.len() as u64;
            events.overflowed = true;
        } else {
            events.log = log;
        }
    }

    /// Events dropped because the log was full (see [`MAX_EVENTS`]), since the manager was built.
    pub fn num_events_dropped(&self) -> u64 {
        self.state.lock().events.as_ref().map_or(0, |e| e.dropped)
    }

    /// Whether this manager records events.
    pub fn events_enabled(&self) -> bool {
        self.state.lock().events.is_some()
    }

    /// Record that the last `adopted` pages of the path ending at `node` entered the tree, holding
    /// `tokens` (`adopted * page_size` of them) in namespace `ns`.
    pub(super) fn record_stored(
        &self,
        st: &mut State,
        node: NodeId,
        adopted: usize,
        tokens: &[u32],
        ns: Namespace,
    ) -> KvResult<()> {
        if adopted == 0 || st.events.is_none() {
            return Ok(());
        }
        let mut path = Vec::with_capacity(adopted + 1);
        st.tree.path_pages(node, adopted + 1, &mut path);
        let new = &path[path.len() - adopted..];
        let events = st
            .events
            .as_ref()
            .ok_or_else(|| internal_missing("events"))?;
        let parent = if path.len() > adopted {
            Some(
                *events
                    .key_of
                    .get(&path[0].0)
                    .ok_or_else(|| internal_missing("the parent page's key"))?,
            )
        } else {
            None
        };
        let name = st.namespace_label(ns);
        let key_ns = st
            .key_namespace(ns)
            .ok_or_else(|| internal_missing("the namespace's name"))?;
        let mut keys = Vec::with_capacity(adopted);
        let mut prev = parent.unwrap_or(self.root_key);
        for (i, page_tokens) in tokens.chunks_exact(self.page_size).enumerate() {
            debug_assert_eq!(new[i].1, ns);
            prev = page_key(&prev, key_ns, page_tokens);
            keys.push(prev);
        }
        let pages: Vec<PageId> = new.iter().map(|&(p, _)| p).collect();
        let events = st
            .events
            .as_mut()
            .ok_or_else(|| internal_missing("events"))?;
        for (&p, &k) in pages.iter().zip(&keys) {
            events.key_of.insert(p, k);
        }
        events.push(KvEvent::Stored {
            keys,
            parent,
            namespace: name,
            pages,
            medium: MEDIUM_HBM.to_owned(),
            tokens: tokens.to_vec(),
        });
        Ok(())
    }

    /// Record that those of `pages` that were announced left the cache (the tree's, or a windowed
    /// primary group's; other pages are skipped).
    pub(super) fn record_removed(&self, st: &mut State, pages: &[PageId]) {
        let Some(events) = st.events.as_mut() else {
            return;
        };
        let (mut keys, mut kept) = (Vec::new(), Vec::new());
        for p in pages {
            if let Some(k) = events.key_of.remove(p) {
                keys.push(k);
                kept.push(*p);
                events.group_pages.remove(p);
            }
        }
        if kept.is_empty() {
            return;
        }
        events.push(KvEvent::Removed {
            keys,
            pages: kept,
            medium: MEDIUM_HBM.to_owned(),
        });
    }

    /// Record that a windowed primary group cached `pages` (keys `keys`, after the page keyed
    /// `parent`), holding `tokens` in namespace `ns`.
    pub(super) fn record_group_stored(
        &self,
        st: &mut State,
        keys: &[PageKey],
        parent: Option<PageKey>,
        pages: &[PageId],
        tokens: &[u32],
        ns: Namespace,
    ) {
        let name = st.namespace_label(ns);
        let Some(events) = st.events.as_mut() else {
            return;
        };
        let ps = tokens.len() / pages.len().max(1);
        for (i, (&p, &k)) in pages.iter().zip(keys).enumerate() {
            events.key_of.insert(p, k);
            events.next_group_order += 1;
            events.group_pages.insert(
                p,
                GroupPage {
                    order: events.next_group_order,
                    parent: if i == 0 { parent } else { Some(keys[i - 1]) },
                    namespace: name.clone(),
                    tokens: tokens[i * ps..(i + 1) * ps].to_vec(),
                },
            );
        }
        events.push(KvEvent::Stored {
            keys: keys.to_vec(),
            parent,
            namespace: name,
            pages: pages.to_vec(),
            medium: MEDIUM_HBM.to_owned(),
            tokens: tokens.to_vec(),
        });
    }

    /// Record that the tree swapped in a sequence's copies (`(position, old, new)` on the path of
    /// `node`, which ends `end_pages` from the root and holds `path_tokens`): each key leaves with
    /// its old page and comes back with the new one, so that a router's key -> page index follows.
    pub(super) fn record_swapped(
        &self,
        st: &mut State,
        node: NodeId,
        end_pages: usize,
        swapped: &[(usize, PageId, PageId)],
        path_tokens: &[u32],
    ) -> KvResult<()> {
        if st.events.is_none() {
            return Ok(());
        }
        let mut path = Vec::with_capacity(end_pages);
        st.tree.path_pages(node, end_pages, &mut path);
        // In path order, so that a swapped parent's key has moved to its new page first.
        let mut swapped = swapped.to_vec();
        swapped.sort_unstable_by_key(|&(pos, _, _)| pos);
        for (pos, old, new) in swapped {
            let ns = path
                .get(pos)
                .map(|&(_, ns)| ns)
                .ok_or_else(|| internal_missing("a swapped page"))?;
            let name = st.namespace_label(ns);
            let events = st
                .events
                .as_mut()
                .ok_or_else(|| internal_missing("events"))?;
            let key = events
                .key_of
                .remove(&old)
                .ok_or_else(|| internal_missing("a swapped page's key"))?;
            let parent = match pos.checked_sub(1) {
                Some(prev) => Some(
                    *events
                        .key_of
                        .get(&path[prev].0)
                        .ok_or_else(|| internal_missing("the parent page's key"))?,
                ),
                None => None,
            };
            events.key_of.insert(new, key);
            events.push(KvEvent::Removed {
                keys: vec![key],
                pages: vec![old],
                medium: MEDIUM_HBM.to_owned(),
            });
            let ps = self.page_size;
            events.push(KvEvent::Stored {
                keys: vec![key],
                parent,
                namespace: name,
                pages: vec![new],
                medium: MEDIUM_HBM.to_owned(),
                tokens: path_tokens
                    .get(pos * ps..(pos + 1) * ps)
                    .ok_or_else(|| internal_missing("a swapped page's tokens"))?
                    .to_vec(),
            });
        }
        Ok(())
    }

    /// Record a reset that left nothing cached.
    pub(super) fn record_cleared(&self, st: &mut State) {
        if let Some(events) = st.events.as_mut() {
            if st.tree.num_cached_pages() == 0 && events.group_pages.is_empty() {
                events.key_of.clear();
                events.push(KvEvent::AllCleared {
                    medium: MEDIUM_HBM.to_owned(),
                });
            }
        }
    }
}

fn internal_missing(what: &str) -> crate::error::KvError {
    internal(crate::error::KvError::Internal(format!(
        "events: {what} is missing"
    )))
}

impl State {
    /// How events name `ns`: `None` for the default namespace, `"*"` for the public one.
    pub(super) fn namespace_label(&self, ns: Namespace) -> Option<String> {
        match self.key_namespace(ns)? {
            KeyNamespace::Default => None,
            KeyNamespace::Public => Some(super::PUBLIC_NAMESPACE_NAME.to_owned()),
            KeyNamespace::Named(name) => Some(name.to_owned()),
        }
    }
}
