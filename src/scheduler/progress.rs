//! A `jobs` partition's firing progress, carried in the metadata of the partition's
//! transactional offset commit, so that a plain fire needs no write to `timers`.
//!
//! Every transaction that changes a partition's timers commits that partition's `jobs` offset,
//! and with it this partition's `Progress`, atomically with everything else it writes:
//!
//! - `seq` numbers the partition's transactions. A timer state written to `timers` carries the
//!   `seq` of its transaction (header `tocsin-seq`), and the node's store keeps, per timer,
//!   the `seq` its state is current as of.
//! - `fired` is set by a transaction after which every timer of the partition wakes later
//!   than the transaction's instant `now`: `fired = now @ seq`. Such a transaction does not
//!   write the timers it fired plainly (`fire::fired_plainly`: one instant on time, nothing
//!   pending or in flight). Any other transaction writes every timer it changes, and leaves
//!   `fired` as it was.
//!
//! A restore then gets every timer back as the last owner had it: a state written before
//! `fired.seq` (`state seq < fired.seq`) that wakes at or before `fired.through_ms` was fired
//! plainly since, through that instant (`fire::advance`); any other state is exact. Why: when
//! `fired` was set, no timer woke at or before `through_ms`, so such a state's instants up to
//! it were all fired; and every fire that was not plain, or not covered by a `fired` set in
//! its own transaction, wrote the timer (a state written at or after `fired.seq` is current).
//!
//! With a lookahead (`fire::Lookahead`), "wakes" means the instant the timer is indexed at,
//! its wake instant less its job's lead, and a transaction at `now` fires a job's instants
//! through `now` plus its lead. The mark names its lookahead (`ahead=`), so a restore advances
//! each job through the mark's `through_ms` plus the lead the mark was made with, whatever
//! this node's lookahead; and a mark replaces the previous one only if it fires at least as
//! far for every job (`FiredThrough::covers`), so a node with a shorter lookahead never
//! records less than was fired.
//!
//! A commit without this metadata (written before Tocsin kept it, or by something else)
//! reads as no progress: nothing is advanced, which is exact for timers that were written at
//! every fire.

use super::fire::Lookahead;
use crate::model::records::TimerState;

/// What a metadata string of ours starts with; the version follows.
const TAG: &str = "tocsin-progress/1";

/// The progress of one `jobs` partition, as of its last committed transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// The partition's last transaction number.
    pub seq: u64,
    /// The latest transaction after which no timer of the partition woke at or before its
    /// instant.
    pub fired: Option<FiredThrough>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FiredThrough {
    pub through_ms: i64,
    pub seq: u64,
    /// The lookahead the partition was fired with (`fire::Lookahead`): a job's instants were
    /// fired through `through_ms` plus its lead. 0 in metadata that does not name it.
    pub ahead_ms: i64,
}

impl FiredThrough {
    /// Whether this mark fires at least as far as `earlier` for every job: a mark replaces
    /// the partition's previous one only then, so a node with a shorter lookahead never
    /// records less than was fired (the next restore would fire it again).
    pub fn covers(&self, earlier: &FiredThrough) -> bool {
        self.through_ms >= earlier.through_ms
            && self.through_ms.saturating_add(self.ahead_ms)
                >= earlier.through_ms.saturating_add(earlier.ahead_ms)
    }
}

impl Progress {
    /// Reads the metadata of a committed offset. Anything not ours, or malformed, is no
    /// progress.
    pub fn decode(metadata: &str) -> Progress {
        let mut words = metadata.split_ascii_whitespace();
        if words.next() != Some(TAG) {
            return Progress::default();
        }
        let mut p = Progress::default();
        let mut ahead = 0;
        for word in words {
            match word.split_once('=') {
                Some(("seq", v)) => match v.parse() {
                    Ok(seq) => p.seq = seq,
                    Err(_) => return Progress::default(),
                },
                Some(("ahead", v)) => match v.parse() {
                    Ok(ms) if ms >= 0 => ahead = ms,
                    _ => return Progress::default(),
                },
                Some(("fired", v)) => {
                    let parsed = v.split_once('@').and_then(|(t, s)| {
                        Some(FiredThrough {
                            through_ms: t.parse().ok()?,
                            seq: s.parse().ok()?,
                            ahead_ms: 0,
                        })
                    });
                    match parsed {
                        Some(f) => p.fired = Some(f),
                        None => return Progress::default(),
                    }
                }
                _ => {} // a later version's field
            }
        }
        if let Some(f) = &mut p.fired {
            f.ahead_ms = ahead;
        }
        match p.fired {
            Some(f) if f.seq > p.seq => Progress::default(),
            _ => p,
        }
    }

    /// The metadata string: well under the broker's `offset.metadata.max.bytes` (4096).
    pub fn encode(&self) -> String {
        match self.fired {
            Some(f) if f.ahead_ms != 0 => format!(
                "{TAG} seq={} fired={}@{} ahead={}",
                self.seq, f.through_ms, f.seq, f.ahead_ms
            ),
            Some(f) => format!("{TAG} seq={} fired={}@{}", self.seq, f.through_ms, f.seq),
            None => format!("{TAG} seq={}", self.seq),
        }
    }

    /// Whether a restored state, current as of `state_seq`, was fired plainly since it was
    /// written, and through which instant it must be advanced: `fired.through_ms` plus its
    /// job's lead under the lookahead the mark was made with (which may not be this node's).
    pub fn advances(&self, state_seq: u64, state: &TimerState) -> Option<i64> {
        let f = self.fired?;
        let ahead = Lookahead::new(f.ahead_ms);
        let wake = ahead.wake(state)?;
        (state_seq < f.seq && wake <= f.through_ms)
            .then(|| ahead.horizon(&state.definition, f.through_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for p in [
            Progress::default(),
            Progress {
                seq: 7,
                fired: None,
            },
            Progress {
                seq: 12,
                fired: Some(FiredThrough {
                    through_ms: 1_764_000_000_123,
                    seq: 11,
                    ahead_ms: 0,
                }),
            },
            Progress {
                seq: 13,
                fired: Some(FiredThrough {
                    through_ms: 1_764_000_000_123,
                    seq: 13,
                    ahead_ms: 1_000,
                }),
            },
            Progress {
                seq: u64::MAX,
                fired: Some(FiredThrough {
                    through_ms: -5,
                    seq: u64::MAX,
                    ahead_ms: i64::MAX,
                }),
            },
        ] {
            let text = p.encode();
            assert!(text.len() < 100, "{text}");
            assert_eq!(Progress::decode(&text), p, "{text}");
        }
    }

    #[test]
    fn anything_else_is_no_progress() {
        for text in [
            "",
            "some other tool's metadata",
            "tocsin-progress/1 seq=x",
            "tocsin-progress/1 seq=3 fired=12",
            "tocsin-progress/1 seq=3 fired=a@1",
            // A fired mark from a later transaction than the last one is not ours to trust.
            "tocsin-progress/1 seq=3 fired=100@4",
            "tocsin-progress/2x seq=3",
            "tocsin-progress/1 seq=3 fired=100@2 ahead=-1",
            "tocsin-progress/1 seq=3 fired=100@2 ahead=x",
        ] {
            assert_eq!(Progress::decode(text), Progress::default(), "{text:?}");
        }
        // A later version's extra field is ignored.
        assert_eq!(Progress::decode("tocsin-progress/1 seq=3 lanes=9").seq, 3);
        // Written before the lookahead: fired with none.
        let old = Progress::decode("tocsin-progress/1 seq=3 fired=100@2");
        assert_eq!(old.fired.map(|f| f.ahead_ms), Some(0));
    }

    /// A state of a job run by workers (led) or a `kafka` job (never led), next due at `wake`.
    fn state(kafka: bool, wake: i64) -> TimerState {
        use crate::model::job::HandlerKind;
        let mut s = crate::scheduler::store::testing::timer("j", "t", wake);
        if !kafka {
            s.definition.handler.kind = HandlerKind::Exec;
        }
        s
    }

    fn mark(through_ms: i64, seq: u64, ahead_ms: i64) -> Progress {
        Progress {
            seq: 10,
            fired: Some(FiredThrough {
                through_ms,
                seq,
                ahead_ms,
            }),
        }
    }

    #[test]
    fn advances_only_states_written_before_the_mark_and_due_by_it() {
        let p = mark(5_000, 8, 0);
        let at = |wake| state(true, wake);
        assert_eq!(p.advances(7, &at(4_000)), Some(5_000));
        assert_eq!(p.advances(7, &at(5_000)), Some(5_000));
        // Wakes later: nothing fired since.
        assert_eq!(p.advances(7, &at(5_001)), None);
        // Written by the marking transaction or after it: current.
        assert_eq!(p.advances(8, &at(4_000)), None);
        assert_eq!(p.advances(9, &at(4_000)), None);
        // Paused.
        let mut paused = at(4_000);
        paused.definition.paused = true;
        assert_eq!(p.advances(7, &paused), None);
        assert_eq!(Progress::default().advances(0, &at(1)), None);
    }

    #[test]
    fn a_mark_made_with_a_lookahead_advances_led_jobs_through_its_lead() {
        let p = mark(5_000, 8, 1_000);
        // Led: indexed a second early, so due by the mark up to 6 s, and fired through 6 s.
        assert_eq!(p.advances(7, &state(false, 6_000)), Some(6_000));
        assert_eq!(p.advances(7, &state(false, 6_001)), None);
        // A `kafka` job is never led, whatever the mark's lookahead.
        assert_eq!(p.advances(7, &state(true, 5_000)), Some(5_000));
        assert_eq!(p.advances(7, &state(true, 5_500)), None);
    }

    #[test]
    fn a_mark_replaces_another_only_if_it_fires_as_far_for_every_job() {
        let f = |through_ms, ahead_ms| FiredThrough {
            through_ms,
            seq: 1,
            ahead_ms,
        };
        assert!(f(5_000, 0).covers(&f(5_000, 0)));
        assert!(f(6_000, 0).covers(&f(5_000, 1_000)));
        assert!(f(5_000, 1_000).covers(&f(5_000, 0)));
        // A shorter lookahead: led jobs were fired through 6 s, the new mark says 5.5 s.
        assert!(!f(5_500, 0).covers(&f(5_000, 1_000)));
        // Time never goes back for `kafka` jobs.
        assert!(!f(4_900, 2_000).covers(&f(5_000, 0)));
    }
}
