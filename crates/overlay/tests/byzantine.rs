//! The routing experiment of `redoubt bench overlay` (part b) in the simulator: a relay on the
//! cheapest route starts dropping 30% of what it forwards; the source must localise it, route
//! around it, and bring the ordered stream back to its rate with every message delivered.

use redoubt_overlay::sim::bench::{byzantine_reroute, ByzantineStats, Phase};

/// Node 1 drops 30% from 15 s into a 45 s stream of 125 messages/s (1 Mbit/s); every
/// message must be accepted and delivered. Returns the run and its phase after the first
/// accusation.
fn run(alt_latency_ms: u64, seed: u64) -> (ByzantineStats, Phase) {
    let s = byzantine_reroute(300, 8, 45, 15, alt_latency_ms, seed);
    assert_eq!(s.sent, 45 * 125, "seed {seed}: no submission refused");
    assert_eq!(s.delivered, s.sent, "seed {seed}: every message arrives");
    let after = s.phases.last().expect("phases").clone();
    assert_eq!(after.name, "after the accusation", "seed {seed}");
    (s, after)
}

#[test]
fn a_dropping_relay_is_localised_and_the_stream_recovers() {
    for seed in 1..=3 {
        let (s, after) = run(11, seed);
        let localise = s.localise_ms.expect("localised");
        assert!(
            localise < 5_000,
            "seed {seed}: localised after {localise} ms"
        );
        assert!(
            after.delivered_per_s >= 120.0 && after.mean_delay_ms < 200.0,
            "seed {seed}: {after:?}"
        );
        assert!(
            s.accusations <= 2,
            "seed {seed}: {} accusations",
            s.accusations
        );
    }
}

/// The faulty relay's route stays the cheaper one (0-2-3 costs 30% more), so each time an
/// accused link's weight falls back the source tries it again. Repeat offenders wait longer,
/// and no message is lost.
#[test]
fn a_relay_on_a_much_cheaper_route_is_banned_longer_each_time() {
    for seed in 1..=3 {
        let (s, after) = run(13, seed);
        assert!(after.delivered_per_s >= 110.0, "seed {seed}: {after:?}");
        // Bans grow fourfold per conviction of the same link, so the returns thin out: fewer
        // than one accusation per two seconds of the 28 s after the first.
        assert!(
            s.accusations <= 14,
            "seed {seed}: {} accusations",
            s.accusations
        );
    }
}
