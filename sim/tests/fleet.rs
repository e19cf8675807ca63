//! The fleet simulator: several replicas over one store and backend, with pauses, crashes,
//! drift and store faults. Runs in debug builds here, so every core also checks its own
//! invariants after every input.

use sim::fleet::{run_fleet_seed, FleetOptions, MARKS};

#[test]
fn a_fleet_of_three_passes_every_check_and_reaches_every_mark() {
    let mut marks = std::collections::BTreeSet::new();
    for seed in 0..150 {
        let report = run_fleet_seed(seed, FleetOptions::new(3));
        assert_eq!(report.failure, None, "seed {seed}");
        marks.extend(report.marks);
    }
    let missing: Vec<_> = MARKS.iter().filter(|m| !marks.contains(*m)).collect();
    assert!(missing.is_empty(), "marks never reached: {missing:?}");
}

#[test]
fn a_fleet_seed_replays_exactly() {
    let a = run_fleet_seed(7, FleetOptions::new(3));
    let b = run_fleet_seed(7, FleetOptions::new(3));
    assert_eq!((a.steps, a.inputs, &a.marks), (b.steps, b.inputs, &b.marks));
}

/// The canary of the backend's fencing check: without it, a stale replica's change lands on a
/// sandbox after a newer owner's, and `token-order` catches it.
#[test]
fn without_the_backends_fencing_a_stale_replicas_change_is_caught() {
    let found = (0..300).find_map(|seed| {
        let opts = FleetOptions {
            backend_fencing: false,
            ..FleetOptions::new(3)
        };
        run_fleet_seed(seed, opts)
            .failure
            .filter(|f| f.starts_with("invariant token-order"))
            .map(|f| (seed, f))
    });
    assert!(found.is_some(), "no seed of 300 caught a stale change");
}
