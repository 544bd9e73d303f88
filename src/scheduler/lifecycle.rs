//! A `jobs` partition's lifecycle on the node that was assigned it, as a pure state machine:
//! `on(event)` returns what the engine must do, and nothing here touches Kafka, the store or
//! the clock (time comes in with the events), so every transition is unit-tested.
//!
//! ```text
//!   assigned ──► Restoring ──(our barrier read back)──► Active ──(revoked)──► gone
//!                 │  ▲
//!                 │  └─ records of `jobs`/`control` are buffered, in order
//!                 ├──── committed offsets fetched ──► barrier written ──► barrier committed
//!                 └──── barrier committed, not back after FENCE_AFTER, previous owner known
//!                       ──► fence that owner (once per attempt; the engine limits repeats,
//!                           and fences only a node the group no longer has)
//! ```
//!
//! Restoring replays the partition's `timers` from the store's checkpoint up to our barrier: a
//! record with our token, written in a transaction of ours. Reading it back through a
//! `read_committed` consumer proves every earlier transaction on the partition has ended
//! (committed or aborted), so the replayed state is the partition's whole state. A barrier of
//! another node read on the way names the partition's previous owner: if ours does not come
//! back, that owner's open transaction is what holds it.

use std::time::Duration;

/// How long our barrier may take to come back before the previous owner is fenced.
pub const FENCE_AFTER: Duration = Duration::from_secs(1);

/// Where a partition stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase<M> {
    Restoring {
        token: String,
        /// Whether the partition's committed offsets (and progress) are in: the barrier's
        /// transaction commits them again, so it is written only after.
        offsets_fetched: bool,
        /// When our barrier committed, in ms (`None`: still to be written).
        barrier_at_ms: Option<i64>,
        /// The node whose barrier we last replayed: the partition's previous owner.
        previous_owner: Option<String>,
        /// Records consumed from `jobs`/`control` before the partition is active.
        buffered: Vec<M>,
    },
    Active,
}

/// What happens to a partition.
#[derive(Debug)]
pub enum Event<'a, M> {
    /// The partition's committed offsets were fetched.
    OffsetsFetched,
    /// Our barrier's transaction committed at `at_ms`.
    BarrierCommitted { at_ms: i64 },
    /// The replay read a barrier record written by `owner`, carrying `token`.
    BarrierRead { owner: &'a str, token: &'a [u8] },
    /// A record of the partition's `jobs` or `control` was consumed.
    Record(M),
    /// Time has come to `now_ms`.
    Tick { now_ms: i64 },
}

/// What the engine must do.
#[derive(Debug, PartialEq, Eq)]
pub enum Action<M> {
    /// The replay is complete: stop it, apply `buffered` (in order), then fire the partition.
    Activate { buffered: Vec<M> },
    /// Fence this node's transactional id: its open transaction holds our barrier.
    Fence(String),
    /// Apply this record now.
    Apply(M),
}

/// One partition's lifecycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifecycle<M> {
    /// This node's id: its own barriers never name a previous owner.
    me: String,
    phase: Phase<M>,
}

impl<M> Lifecycle<M> {
    /// A partition just assigned: restoring, its barrier (carrying `token`) still to write.
    pub fn assigned(me: &str, token: String) -> Lifecycle<M> {
        Lifecycle {
            me: me.to_owned(),
            phase: Phase::Restoring {
                token,
                offsets_fetched: false,
                barrier_at_ms: None,
                previous_owner: None,
                buffered: Vec::new(),
            },
        }
    }

    /// The token of this assignment, while its committed offsets are still to be fetched.
    pub fn offsets_to_fetch(&self) -> Option<&str> {
        match &self.phase {
            Phase::Restoring {
                token,
                offsets_fetched: false,
                ..
            } => Some(token),
            _ => None,
        }
    }

    /// The token of this assignment while restoring: a fetch or a write started for an
    /// earlier assignment of the partition carries another.
    pub fn restoring_token(&self) -> Option<&str> {
        match &self.phase {
            Phase::Restoring { token, .. } => Some(token),
            Phase::Active => None,
        }
    }

    /// The node whose barrier the replay read last: the partition's previous owner, as far
    /// as `timers` tells.
    pub fn previous_owner(&self) -> Option<&str> {
        match &self.phase {
            Phase::Restoring { previous_owner, .. } => previous_owner.as_deref(),
            Phase::Active => None,
        }
    }

    pub fn is_active(&self) -> bool {
        matches!(self.phase, Phase::Active)
    }

    /// The token of the barrier still to be written, once the offsets are in.
    pub fn barrier_to_write(&self) -> Option<&str> {
        match &self.phase {
            Phase::Restoring {
                token,
                offsets_fetched: true,
                barrier_at_ms: None,
                ..
            } => Some(token),
            _ => None,
        }
    }

    pub fn on(&mut self, event: Event<'_, M>) -> Option<Action<M>> {
        match (&mut self.phase, event) {
            (Phase::Active, Event::Record(m)) => Some(Action::Apply(m)),
            (Phase::Active, _) => None,
            (Phase::Restoring { buffered, .. }, Event::Record(m)) => {
                buffered.push(m);
                None
            }
            (
                Phase::Restoring {
                    offsets_fetched, ..
                },
                Event::OffsetsFetched,
            ) => {
                *offsets_fetched = true;
                None
            }
            (Phase::Restoring { barrier_at_ms, .. }, Event::BarrierCommitted { at_ms }) => {
                *barrier_at_ms = Some(at_ms);
                None
            }
            (
                Phase::Restoring {
                    token,
                    previous_owner,
                    ..
                },
                Event::BarrierRead { owner, token: read },
            ) => {
                if read == token.as_bytes() {
                    let Phase::Restoring { buffered, .. } =
                        std::mem::replace(&mut self.phase, Phase::Active)
                    else {
                        unreachable!("matched Restoring above");
                    };
                    Some(Action::Activate { buffered })
                } else {
                    if owner != self.me {
                        *previous_owner = Some(owner.to_owned());
                    }
                    None
                }
            }
            (
                Phase::Restoring {
                    barrier_at_ms: Some(at),
                    previous_owner: Some(owner),
                    ..
                },
                Event::Tick { now_ms },
            ) if now_ms - *at >= FENCE_AFTER.as_millis() as i64 => {
                Some(Action::Fence(owner.clone()))
            }
            (Phase::Restoring { .. }, Event::Tick { .. }) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type L = Lifecycle<u32>;

    fn restoring() -> L {
        L::assigned("n2", "n2/1/7/1000".into())
    }

    #[test]
    fn records_wait_for_the_barrier_then_apply_in_order() {
        let mut l = restoring();
        assert_eq!(l.offsets_to_fetch(), Some("n2/1/7/1000"));
        assert_eq!(l.barrier_to_write(), None, "not before the offsets are in");
        assert_eq!(l.on(Event::OffsetsFetched), None);
        assert_eq!(l.offsets_to_fetch(), None);
        assert_eq!(l.barrier_to_write(), Some("n2/1/7/1000"));
        assert_eq!(l.on(Event::Record(1)), None);
        assert_eq!(l.on(Event::BarrierCommitted { at_ms: 1_100 }), None);
        assert_eq!(l.barrier_to_write(), None);
        assert_eq!(l.on(Event::Record(2)), None);
        let back = Event::BarrierRead {
            owner: "n2",
            token: b"n2/1/7/1000",
        };
        assert_eq!(
            l.on(back),
            Some(Action::Activate {
                buffered: vec![1, 2]
            })
        );
        assert!(l.is_active());
        assert_eq!(l.on(Event::Record(3)), Some(Action::Apply(3)));
    }

    #[test]
    fn a_barrier_of_an_earlier_assignment_of_ours_does_not_activate() {
        let mut l = restoring();
        l.on(Event::BarrierCommitted { at_ms: 1_100 });
        let stale = Event::BarrierRead {
            owner: "n2",
            token: b"n2/0/7/500",
        };
        assert_eq!(l.on(stale), None);
        assert!(!l.is_active());
        // Our own old barrier names no previous owner: nothing to fence.
        assert_eq!(l.on(Event::Tick { now_ms: 60_000 }), None);
    }

    #[test]
    fn a_stalled_previous_owner_is_fenced_once_our_barrier_is_late() {
        let mut l = restoring();
        let theirs = Event::BarrierRead {
            owner: "n1",
            token: b"n1/4/7/300",
        };
        assert_eq!(l.on(theirs), None);
        assert_eq!(l.previous_owner(), Some("n1"));
        // Not before our barrier committed, however long it takes to write it.
        assert_eq!(l.on(Event::Tick { now_ms: 10_000 }), None);
        l.on(Event::BarrierCommitted { at_ms: 10_000 });
        assert_eq!(l.on(Event::Tick { now_ms: 10_999 }), None);
        assert_eq!(
            l.on(Event::Tick { now_ms: 11_000 }),
            Some(Action::Fence("n1".into()))
        );
        // Once active, nothing is fenced.
        let back = Event::BarrierRead {
            owner: "n2",
            token: b"n2/1/7/1000",
        };
        assert!(matches!(l.on(back), Some(Action::Activate { .. })));
        assert_eq!(l.on(Event::Tick { now_ms: 20_000 }), None);
    }

    #[test]
    fn the_last_foreign_barrier_names_the_previous_owner() {
        let mut l = restoring();
        for (owner, token) in [("n1", &b"n1/1/7/1"[..]), ("n3", &b"n3/2/7/2"[..])] {
            l.on(Event::BarrierRead { owner, token });
        }
        l.on(Event::BarrierCommitted { at_ms: 0 });
        assert_eq!(
            l.on(Event::Tick { now_ms: 5_000 }),
            Some(Action::Fence("n3".into()))
        );
    }

    #[test]
    fn an_active_partition_ignores_barriers_and_time() {
        let mut l = restoring();
        l.on(Event::BarrierRead {
            owner: "n2",
            token: b"n2/1/7/1000",
        });
        assert!(l.is_active());
        assert_eq!(l.on(Event::BarrierCommitted { at_ms: 1 }), None);
        let again = Event::BarrierRead {
            owner: "n1",
            token: b"x",
        };
        assert_eq!(l.on(again), None);
        assert!(l.is_active());
    }
}
