//! The due scan of one tick: what the bucket index holds due in the active partitions, taken
//! in bounded rounds and handed to the firing in the fair order (`fair`), until nothing due is
//! left. A partition with more due than its share of a round is scanned again in the same
//! tick, so a herd on one partition drains within the tick, not one slice a tick.

use std::time::{Duration, Instant};

use super::fair::interleave_by_tenant;
use super::store::{DueEntry, Store, StoreError};

/// Most due entries gathered in one round. Fairness across tenants holds within one round:
/// the index is ordered by instant and job id, not tenant, so a herd larger than this is taken
/// in slices, and a small tenant's runs in a later slice wait for it. At about 100 bytes an
/// entry, a million is 100 MB for the moment of a herd that size.
pub const SCAN_LIMIT: usize = 1_000_000;
/// Rounds of one tick: a partition with more due than its share is scanned again until
/// nothing due is left, at most this often (a timer that cannot move on, such as one whose
/// stored schedule no longer parses, must not hold the tick).
pub const SCAN_ROUNDS: usize = 64;
/// The least share of a round one partition gets, however many are scanned.
const MIN_SHARE: usize = 1_000;

/// One round of a tick's scan.
#[derive(Debug)]
pub struct Round {
    /// 0 for the tick's first.
    pub number: usize,
    /// What is due, in the fair order.
    pub due: Vec<DueEntry>,
    /// The partitions whose scan stopped at their share: more may be due there.
    pub truncated: Vec<i32>,
    /// How long the scan took.
    pub took: Duration,
}

/// Scans `partitions` for what is due at `now`, `limit` entries a round at most (each
/// partition at least `MIN_SHARE`), and hands each round that found anything to `fire`,
/// which fires it and returns which of its truncated partitions to scan again (those still
/// active). Returns how many entries the first round found.
pub fn tick<E: From<StoreError>>(
    store: &Store,
    partitions: Vec<i32>,
    now: i64,
    limit: usize,
    mut fire: impl FnMut(Round) -> Result<Vec<i32>, E>,
) -> Result<usize, E> {
    let mut scan = partitions;
    let mut first = 0;
    for number in 0..SCAN_ROUNDS {
        if scan.is_empty() {
            break;
        }
        let started = Instant::now();
        let share = (limit / scan.len()).max(MIN_SHARE);
        let mut due = Vec::new();
        let mut truncated = Vec::new();
        for p in &scan {
            let before = due.len();
            store.due(*p as u16, now, share, &mut due)?;
            if due.len() - before >= share {
                truncated.push(*p);
            }
        }
        if number == 0 {
            first = due.len();
        }
        if due.is_empty() {
            break;
        }
        let due = interleave_by_tenant(due);
        scan = fire(Round {
            number,
            due,
            truncated,
            took: started.elapsed(),
        })?;
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::scheduler::store::encode_timer;
    use crate::scheduler::store::testing::{self, timer};

    /// `n` timers of `tenant` in partition `p`, due at `wake`.
    fn put(store: &Store, p: u16, tenant: &str, n: usize, wake: i64) {
        testing::put(
            store,
            p,
            (0..n).map(|i| timer(&format!("{tenant}-{p}-{i}"), tenant, wake)),
        );
    }

    /// Fires a round as the engine does: each entry's timer moves on to `later`.
    fn fire(store: &Store, round: &Round, later: i64) {
        let mut b = store.batch();
        for e in &round.due {
            let t = timer(&e.job, &e.tenant, later);
            b.put_timer(
                store,
                e.partition,
                &t,
                &encode_timer(&t),
                0,
                Some(e.wake_ms),
                Some(later),
            );
        }
        store.write(b).unwrap();
    }

    #[test]
    fn a_partition_past_its_share_drains_in_the_same_tick() {
        let (_dir, store) = testing::store();
        put(&store, 0, "big", 2_500, 1_000);
        put(&store, 1, "small", 10, 1_000);
        let mut fired: BTreeMap<String, usize> = BTreeMap::new();
        let mut rounds = Vec::new();
        let first = tick::<StoreError>(&store, vec![0, 1], 1_000, 2_000, |round| {
            fire(&store, &round, 60_000);
            for e in &round.due {
                *fired.entry(e.job.clone()).or_default() += 1;
            }
            rounds.push((round.number, round.due.len(), round.truncated.clone()));
            Ok(round.truncated)
        })
        .unwrap();
        // Each partition's share of the first round is 1,000: partition 0 is truncated there
        // and scanned again, alone (its share now the whole 2,000), and nothing is left for
        // the next tick.
        assert_eq!(first, 1_010);
        assert_eq!(rounds, vec![(0, 1_010, vec![0]), (1, 1_500, vec![])]);
        assert_eq!(fired.len(), 2_510);
        assert!(fired.values().all(|n| *n == 1), "an entry was fired twice");
        let mut left = Vec::new();
        store.due(0, 1_000, usize::MAX, &mut left).unwrap();
        assert!(left.is_empty());
    }

    #[test]
    fn the_first_round_holds_every_tenant_in_turn() {
        let (_dir, store) = testing::store();
        put(&store, 0, "big", 900, 1_000);
        put(&store, 1, "small", 3, 1_000);
        let mut first_tenants = Vec::new();
        tick::<StoreError>(&store, vec![0, 1], 1_000, SCAN_LIMIT, |round| {
            first_tenants = round.due.iter().take(6).map(|e| e.tenant.clone()).collect();
            fire(&store, &round, 60_000);
            Ok(round.truncated)
        })
        .unwrap();
        assert_eq!(first_tenants.len(), 6);
        assert!(
            first_tenants.windows(2).all(|w| w[0] != w[1]),
            "not in turn: {first_tenants:?}"
        );
    }

    #[test]
    fn a_timer_that_never_moves_holds_the_tick_for_a_bounded_number_of_rounds() {
        let (_dir, store) = testing::store();
        put(&store, 0, "stuck", 1_000, 1_000);
        let mut rounds = 0;
        tick::<StoreError>(&store, vec![0], 1_000, 1_000, |round| {
            rounds += 1;
            // Nothing fires: the same entries are due again.
            Ok(round.truncated)
        })
        .unwrap();
        assert_eq!(rounds, SCAN_ROUNDS);
    }

    #[test]
    fn a_partition_no_longer_active_is_not_scanned_again() {
        let (_dir, store) = testing::store();
        put(&store, 0, "big", 1_500, 1_000);
        let mut rounds = 0;
        let first = tick::<StoreError>(&store, vec![0], 1_000, 1_000, |round| {
            rounds += 1;
            fire(&store, &round, 60_000);
            // The partition was revoked while its first round fired.
            Ok(Vec::new())
        })
        .unwrap();
        assert_eq!((first, rounds), (1_000, 1));
    }

    #[test]
    fn nothing_due_fires_nothing() {
        let (_dir, store) = testing::store();
        put(&store, 0, "later", 5, 9_000);
        let first = tick::<StoreError>(&store, vec![0], 1_000, SCAN_LIMIT, |_| {
            panic!("nothing is due")
        })
        .unwrap();
        assert_eq!(first, 0);
    }
}
