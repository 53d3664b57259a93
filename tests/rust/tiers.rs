//! Lower tiers through the Rust API: the value model's shape, and (ignored) the cost of an
//! admission across tiers against one in HBM:
//! `cargo test --release --test tiers -- --ignored --nocapture`.
use kvcore::eviction::EvictionPolicy;
use kvcore::manager::{KVCacheManager, ManagerConfig, StorePolicy, TierConfig, ValueModel};
use std::time::Instant;

#[test]
fn the_value_model_favours_reuse_fast_tiers_and_deep_prefixes() {
    let m = ValueModel {
        page_bytes: 262_144.0,
        ..ValueModel::default()
    };
    // More hits never make a page less worth storing; a slower tier never makes it more.
    for depth in [0, 10, 100, 1000] {
        let mut prev = false;
        for hits in 0..20 {
            let now = m.worth_storing(hits, depth, 16, 2.0);
            assert!(now || !prev, "hits {hits} depth {depth}");
            prev = now;
        }
        for hits in [0, 1, 5] {
            let fast = m.worth_storing(hits, depth, 16, 25.0);
            let slow = m.worth_storing(hits, depth, 16, 0.1);
            assert!(fast || !slow);
        }
    }
    // A tier slower than recomputing is never worth it.
    assert!(!(0..100).any(|h| m.worth_storing(h, 0, 16, 0.01)));
    // The default (Llama-3.1-8B on an H200: 2 MiB pages, 400 us to recompute one): a 25 GB/s
    // host (84 us a page) is worth it at first sight; a 5 GB/s disk (419 us) is not, as
    // reloading a shallow page costs more than recomputing it.
    let d = ValueModel::default();
    assert!(d.worth_storing(0, 0, 16, 25.0));
    assert!(!d.worth_storing(0, 0, 16, 5.0) && !d.worth_storing(50, 0, 16, 5.0));
}

#[test]
fn check_transfers_accepts_ops_in_flight_only_and_changes_nothing() {
    let m = KVCacheManager::new(ManagerConfig {
        num_pages: 64,
        page_size: 4,
        policy: EvictionPolicy::Lru,
        pin_budget_pages: None,
        fingerprint: vec![],
        events: false,
        lower_tiers: vec![TierConfig {
            name: "host".into(),
            num_slots: 16,
            bandwidth_gbps: 25.0,
        }],
        store_policy: StorePolicy::All,
        groups: Vec::new(),
    })
    .unwrap();
    let tokens: Vec<u32> = (0..9).collect();
    m.add_sequence(1, tokens.as_slice(), None, 0, true, 0)
        .unwrap();
    let queued: Vec<u64> = vec![0];
    assert!(m.check_transfers(&queued).is_err()); // before take_transfers: not in flight
    let b = m.take_transfers(true, true);
    let mut ops: Vec<u64> = b.stores.iter().map(|r| r.op).collect();
    ops.dedup();
    assert!(!ops.is_empty());
    m.check_transfers(&ops).unwrap();
    m.check_transfers(&ops).unwrap(); // nothing changed: still in flight
    let twice: Vec<u64> = ops.iter().chain(&ops).copied().collect();
    assert!(m.check_transfers(&twice).is_err());
    m.complete_transfers(&ops, &vec![true; ops.len()], 0)
        .unwrap();
    let err = m.check_transfers(&ops).unwrap_err().to_string();
    assert!(err.contains("not a transfer in flight"), "{err}");
    assert!(m
        .complete_transfers(&ops, &vec![true; ops.len()], 0)
        .is_err());
}

#[test]
#[ignore]
fn timing() {
    let mk = |tiers: bool| {
        KVCacheManager::new(ManagerConfig {
            num_pages: 20001,
            page_size: 16,
            policy: EvictionPolicy::Lru,
            pin_budget_pages: None,
            fingerprint: vec![],
            events: false,
            lower_tiers: if tiers {
                vec![TierConfig {
                    name: "host".into(),
                    num_slots: 4096,
                    bandwidth_gbps: 25.0,
                }]
            } else {
                vec![]
            },
            store_policy: StorePolicy::All,
            groups: Vec::new(),
        })
        .unwrap()
    };
    let prefix: Vec<u32> = (0..1920).collect();
    let mut prompt = prefix.clone();
    prompt.extend(1_000_000..1_000_128u32);
    for (label, tiers, evict) in [("hbm", false, false), ("host", true, true)] {
        let m = mk(tiers);
        m.add_sequence(-1, prefix.as_slice(), None, 0, true, 0)
            .unwrap();
        let b = m.take_transfers(true, true);
        let mut ops: Vec<u64> = b.stores.iter().map(|r| r.op).collect();
        ops.dedup();
        let oks = vec![true; ops.len()];
        m.complete_transfers(&ops, &oks, 0).unwrap();
        m.free_sequence(-1).unwrap();
        if evict {
            m.evict(1 << 20, 0).unwrap();
        }
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t = Instant::now();
            for _ in 0..200 {
                m.add_sequence(1, prompt.as_slice(), None, 0, true, 0)
                    .unwrap();
                m.free_sequence(1).unwrap();
                if !evict {
                    m.evict(8, 0).unwrap();
                }
            }
            best = best.min(t.elapsed().as_secs_f64() / 200.0 * 1e6);
        }
        println!("{label}: admit + free {best:.2} us");
    }
    // Matching alone, no side effects: HBM-only `peek_prefix_len` against `peek_hit_tokens`
    // with the prefix in the host tier only.
    let hbm = mk(false);
    hbm.add_sequence(-1, prompt.as_slice(), None, 0, true, 0)
        .unwrap();
    hbm.free_sequence(-1).unwrap();
    let host = mk(true);
    host.add_sequence(-1, prompt.as_slice(), None, 0, true, 0)
        .unwrap();
    let b = host.take_transfers(true, true);
    let mut ops: Vec<u64> = b.stores.iter().map(|r| r.op).collect();
    ops.dedup();
    host.complete_transfers(&ops, &vec![true; ops.len()], 0)
        .unwrap();
    host.free_sequence(-1).unwrap();
    host.evict(1 << 20, 0).unwrap();
    let time = |f: &dyn Fn() -> usize| {
        let mut best = f64::MAX;
        for _ in 0..50 {
            let t = Instant::now();
            for _ in 0..1000 {
                assert_eq!(f(), 2032);
            }
            best = best.min(t.elapsed().as_secs_f64() / 1000.0 * 1e9);
        }
        best
    };
    let a = time(&|| hbm.peek_prefix_len(&prompt[..2047], None));
    let b = time(&|| host.peek_hit_tokens(&prompt[..2047], None).iter().sum());
    println!(
        "match 2,032 cached tokens: HBM only {a:.0} ns ({:.3} ns/token), host tier {b:.0} ns ({:.3} ns/token): {:.2}x",
        a / 2032.0,
        b / 2032.0,
        b / a
    );
}
