//! A bounded fault campaign in simulation: hundreds of seeded scenarios (the ring and JACCL) with
//! crashes, stalls, cut links, lost messages and error completions, every invariant checked (see
//! `nuvec_fabric_sim::campaign`).

#[test]
fn a_bounded_campaign_finds_no_violation() {
    let count = std::env::var("NUVEC_CAMPAIGN_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let violations = nuvec_fabric_sim::campaign::run(0, count, 10);
    assert!(
        violations.is_empty(),
        "{} of {count} scenarios failed:\n{}",
        violations.len(),
        violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
