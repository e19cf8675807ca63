//! The fleet simulator: several replicas over one store and backend, with pauses, crashes,
//! drift and store faults. Runs in debug builds here, so every core also checks its own
//! invariants after every input.

use sim::fleet::{run_fleet_seed, FleetOptions, HOST_MARKS, MARKS};

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

/// Hosts over an object store (`sim/src/fleet/hosts.rs`): every check holds, and the
/// object store's faults and the hosts' refusals all happen.
#[test]
fn a_fleet_on_hosts_passes_every_check_and_reaches_every_host_mark() {
    let mut marks = std::collections::BTreeSet::new();
    for seed in 0..150 {
        let opts = FleetOptions {
            hosts: true,
            ..FleetOptions::new(3)
        };
        let report = run_fleet_seed(seed, opts);
        assert_eq!(report.failure, None, "seed {seed}");
        marks.extend(report.marks);
    }
    let missing: Vec<_> = (MARKS.iter().chain(HOST_MARKS))
        .filter(|m| !marks.contains(*m))
        .collect();
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

/// A clean seed's run, written out as a fleet scenario, replays clean: the scenario world
/// takes the seed's choices from the steps and ends as the seed did. `SIM_FLEET_REPLAY_SEEDS`
/// sets how many seeds (default 12).
#[test]
fn a_fleet_seeds_transcript_replays_as_a_scenario() {
    transcripts_replay(false);
}

/// As above, with hosts over an object store (`hosts=on`).
#[test]
fn a_fleet_on_hosts_seeds_transcript_replays_as_a_scenario() {
    transcripts_replay(true);
}

fn transcripts_replay(hosts: bool) {
    use sim::scenario::{run_steps, RunMode, Scenario, Verdict};
    let seeds: u64 = std::env::var("SIM_FLEET_REPLAY_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let mut differ = vec![];
    for seed in 0..seeds {
        let opts = FleetOptions {
            transcript: true,
            hosts,
            ..FleetOptions::new(3)
        };
        let report = run_fleet_seed(seed, opts);
        assert_eq!(report.failure, None, "seed {seed}");
        let t = report.transcript.expect("asked for");
        let scenario = Scenario {
            config: t.config,
            close_deadline: std::time::Duration::from_secs(10),
            steps: t
                .steps
                .into_iter()
                .enumerate()
                .map(|(i, s)| (i + 3, s))
                .collect(),
            fleet: Some(t.spec),
        };
        let (verdict, _) = run_steps(&scenario, RunMode::Strict, None);
        if verdict != Verdict::Pass {
            differ.push(format!("seed {seed}: {verdict:?}"));
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {seeds}:\n{}",
        differ.len(),
        differ.join("\n")
    );
}

/// A failing fleet seed shrinks to a fleet scenario that fails the same check: here the hand-made
/// canary of the backend's fencing (`backend-fencing=off`), which `token-order` catches.
#[test]
fn a_failing_fleet_seed_shrinks_to_a_fleet_scenario() {
    use sim::scenario::{parse, run_scenario, Verdict};
    use sim::shrink::shrink_fleet_seed;
    let opts = FleetOptions {
        backend_fencing: false,
        ..FleetOptions::new(3)
    };
    let seed = (0..300)
        .find(|seed| run_fleet_seed(*seed, opts).invariant.as_deref() == Some("token-order"))
        .expect("a seed of 300 breaks token-order without the backend's fencing");
    let shrunk = shrink_fleet_seed(seed, opts).expect("shrinks");
    assert_eq!(shrunk.invariant, "token-order");
    assert!(shrunk.steps < shrunk.original_steps / 2, "{shrunk:?}");
    let scenario = parse(&shrunk.text).expect("the shrunk scenario parses");
    assert!(scenario.fleet.as_ref().is_some_and(|f| !f.backend_fencing));
    match run_scenario(&scenario, None) {
        Verdict::Fail { failure, .. } => assert_eq!(failure.invariant, "token-order"),
        other => panic!("the shrunk scenario gives {other:?}:\n{}", shrunk.text),
    }
    // With the backend's fencing on, the same steps are no longer all answers it gives.
    let fenced = shrunk.text.replace(" backend-fencing=off", "");
    let verdict = run_scenario(&parse(&fenced).expect("parses"), None);
    assert!(
        !matches!(&verdict, Verdict::Fail { failure, .. } if failure.invariant == "token-order"),
        "{verdict:?}"
    );
}
