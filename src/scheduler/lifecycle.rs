//! A `jobs` partition's lifecycle on the node that was assigned it, as a pure state machine:
//! `on(event)` returns what the engine must do, and nothing here touches Kafka, the store or
//! the clock (time comes in with the events), so every transition is unit-tested.
//!
//! ```text
//!   assigned ──► Restoring ──(replay caught up with the mark)──► Active ──(revoked)──► gone
//!                 │  ▲
//!                 │  └─ records of `jobs`/`control` are buffered, in order
//!                 ├──── committed offsets fetched ──► replay end marked
//!                 └──── marked, not caught up after FENCE_AFTER
//!                       ──► fence the previous owner (the engine asks the fencer, which
//!                           fences only a node the group no longer has, and limits repeats)
//! ```
//!
//! Restoring replays the partition's `timers` from the store's checkpoint up to a mark: the
//! partition's high watermark, listed only after its committed offsets were fetched. Once the
//! fetch is answered, no transaction but ours can still commit records to the partition (see
//! `restore`), so everything committed to it lies below the mark; a `read_committed` reader
//! past the mark has seen every earlier transaction end (committed or aborted), and the
//! replayed state is the partition's whole state. A barrier record of another node read on
//! the way (written by earlier builds) names the partition's previous owner.

use std::time::Duration;

/// How long the replay may take to reach its mark before the previous owner is fenced.
pub const FENCE_AFTER: Duration = Duration::from_secs(1);

/// Where a partition stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase<M> {
    Restoring {
        token: String,
        /// Whether the partition's committed offsets (and progress) are in: the replay's end
        /// is marked only after.
        offsets_fetched: bool,
        /// When the replay's end was marked, in ms (`None`: still to mark).
        marked_at_ms: Option<i64>,
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
    /// The replay's end was marked at `at_ms`.
    Marked { at_ms: i64 },
    /// The replay has read the partition up to its mark.
    CaughtUp,
    /// The replay read a barrier record written by `owner` (earlier builds wrote them to
    /// restore; they still name a previous owner).
    BarrierRead { owner: &'a str },
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
    /// The replay is held past its mark: an open transaction of the previous owner holds the
    /// partition; fence that owner if the group no longer has it.
    Fence,
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
    /// A partition just assigned (`token` names the assignment): restoring, its committed
    /// offsets still to fetch.
    pub fn assigned(me: &str, token: String) -> Lifecycle<M> {
        Lifecycle {
            me: me.to_owned(),
            phase: Phase::Restoring {
                token,
                offsets_fetched: false,
                marked_at_ms: None,
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

    /// The token of this assignment while restoring: a fetch started for an earlier
    /// assignment of the partition carries another.
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

    /// Whether the replay's end is to be marked now: the offsets are in, no mark yet (the
    /// engine marks in the step that takes the offsets in).
    #[cfg(test)]
    pub fn to_mark(&self) -> bool {
        matches!(
            self.phase,
            Phase::Restoring {
                offsets_fetched: true,
                marked_at_ms: None,
                ..
            }
        )
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
            (
                Phase::Restoring {
                    offsets_fetched: true,
                    marked_at_ms,
                    ..
                },
                Event::Marked { at_ms },
            ) => {
                *marked_at_ms = Some(at_ms);
                None
            }
            (Phase::Restoring { .. }, Event::Marked { .. }) => None,
            (
                Phase::Restoring {
                    marked_at_ms: Some(_),
                    ..
                },
                Event::CaughtUp,
            ) => {
                let Phase::Restoring { buffered, .. } =
                    std::mem::replace(&mut self.phase, Phase::Active)
                else {
                    unreachable!("matched Restoring above");
                };
                Some(Action::Activate { buffered })
            }
            (Phase::Restoring { .. }, Event::CaughtUp) => None,
            (Phase::Restoring { previous_owner, .. }, Event::BarrierRead { owner }) => {
                if owner != self.me {
                    *previous_owner = Some(owner.to_owned());
                }
                None
            }
            (
                Phase::Restoring {
                    marked_at_ms: Some(at),
                    ..
                },
                Event::Tick { now_ms },
            ) if now_ms - *at >= FENCE_AFTER.as_millis() as i64 => Some(Action::Fence),
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
    fn records_wait_for_the_replay_then_apply_in_order() {
        let mut l = restoring();
        assert_eq!(l.offsets_to_fetch(), Some("n2/1/7/1000"));
        assert!(!l.to_mark(), "not before the offsets are in");
        assert_eq!(l.on(Event::Record(1)), None);
        assert_eq!(l.on(Event::OffsetsFetched), None);
        assert_eq!(l.offsets_to_fetch(), None);
        assert!(l.to_mark());
        assert_eq!(l.on(Event::Marked { at_ms: 1_100 }), None);
        assert!(!l.to_mark());
        assert_eq!(l.on(Event::Record(2)), None);
        assert_eq!(
            l.on(Event::CaughtUp),
            Some(Action::Activate {
                buffered: vec![1, 2]
            })
        );
        assert!(l.is_active());
        assert_eq!(l.on(Event::Record(3)), Some(Action::Apply(3)));
    }

    #[test]
    fn nothing_activates_before_the_offsets_are_in_and_the_end_is_marked() {
        let mut l = restoring();
        // A mark taken before the offsets were fetched proves nothing: a transaction whose
        // offset commit is pending can still commit records past it.
        assert_eq!(l.on(Event::Marked { at_ms: 10 }), None);
        assert_eq!(l.on(Event::CaughtUp), None);
        assert!(!l.is_active());
        l.on(Event::OffsetsFetched);
        assert!(l.to_mark(), "the early mark did not count");
        assert_eq!(l.on(Event::CaughtUp), None, "not before the mark");
        assert!(!l.is_active());
        l.on(Event::Marked { at_ms: 20 });
        assert!(matches!(
            l.on(Event::CaughtUp),
            Some(Action::Activate { .. })
        ));
    }

    #[test]
    fn a_replay_held_past_its_mark_asks_for_a_fence() {
        let mut l = restoring();
        assert_eq!(l.on(Event::BarrierRead { owner: "n1" }), None);
        assert_eq!(l.previous_owner(), Some("n1"));
        // Not before the end is marked, however long the offsets take.
        assert_eq!(l.on(Event::Tick { now_ms: 10_000 }), None);
        l.on(Event::OffsetsFetched);
        l.on(Event::Marked { at_ms: 10_000 });
        assert_eq!(l.on(Event::Tick { now_ms: 10_999 }), None);
        assert_eq!(l.on(Event::Tick { now_ms: 11_000 }), Some(Action::Fence));
        // Once active, nothing is fenced.
        assert!(matches!(
            l.on(Event::CaughtUp),
            Some(Action::Activate { .. })
        ));
        assert_eq!(l.on(Event::Tick { now_ms: 20_000 }), None);
    }

    #[test]
    fn the_last_foreign_barrier_names_the_previous_owner_and_ours_none() {
        let mut l = restoring();
        for owner in ["n1", "n3", "n2"] {
            l.on(Event::BarrierRead { owner });
        }
        assert_eq!(l.previous_owner(), Some("n3"));
    }

    #[test]
    fn an_active_partition_ignores_the_restore_and_time() {
        let mut l = restoring();
        l.on(Event::OffsetsFetched);
        l.on(Event::Marked { at_ms: 1 });
        l.on(Event::CaughtUp);
        assert!(l.is_active());
        assert_eq!(l.on(Event::OffsetsFetched), None);
        assert_eq!(l.on(Event::Marked { at_ms: 2 }), None);
        assert_eq!(l.on(Event::CaughtUp), None);
        assert_eq!(l.on(Event::BarrierRead { owner: "n1" }), None);
        assert_eq!(l.on(Event::Tick { now_ms: 60_000 }), None);
        assert!(l.is_active());
        assert_eq!(l.previous_owner(), None);
    }
}
