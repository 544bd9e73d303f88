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
//! A commit without this metadata (written before Tocsin kept it, or by something else)
//! reads as no progress: nothing is advanced, which is exact for timers that were written at
//! every fire.

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
        for word in words {
            match word.split_once('=') {
                Some(("seq", v)) => match v.parse() {
                    Ok(seq) => p.seq = seq,
                    Err(_) => return Progress::default(),
                },
                Some(("fired", v)) => {
                    let parsed = v.split_once('@').and_then(|(t, s)| {
                        Some(FiredThrough {
                            through_ms: t.parse().ok()?,
                            seq: s.parse().ok()?,
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
        match p.fired {
            Some(f) if f.seq > p.seq => Progress::default(),
            _ => p,
        }
    }

    /// The metadata string: well under the broker's `offset.metadata.max.bytes` (4096).
    pub fn encode(&self) -> String {
        match self.fired {
            Some(f) => format!("{TAG} seq={} fired={}@{}", self.seq, f.through_ms, f.seq),
            None => format!("{TAG} seq={}", self.seq),
        }
    }

    /// Whether a restored state, current as of `state_seq` and waking at `wake_ms`, was fired
    /// plainly since it was written, and must be advanced through `fired.through_ms`.
    pub fn advances(&self, state_seq: u64, wake_ms: Option<i64>) -> Option<i64> {
        let f = self.fired?;
        let wake = wake_ms?;
        (state_seq < f.seq && wake <= f.through_ms).then_some(f.through_ms)
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
                }),
            },
            Progress {
                seq: u64::MAX,
                fired: Some(FiredThrough {
                    through_ms: -5,
                    seq: u64::MAX,
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
        ] {
            assert_eq!(Progress::decode(text), Progress::default(), "{text:?}");
        }
        // A later version's extra field is ignored.
        assert_eq!(Progress::decode("tocsin-progress/1 seq=3 lanes=9").seq, 3);
    }

    #[test]
    fn advances_only_states_written_before_the_mark_and_due_by_it() {
        let p = Progress {
            seq: 10,
            fired: Some(FiredThrough {
                through_ms: 5_000,
                seq: 8,
            }),
        };
        assert_eq!(p.advances(7, Some(4_000)), Some(5_000));
        assert_eq!(p.advances(7, Some(5_000)), Some(5_000));
        // Wakes later: nothing fired since.
        assert_eq!(p.advances(7, Some(5_001)), None);
        // Written by the marking transaction or after it: current.
        assert_eq!(p.advances(8, Some(4_000)), None);
        assert_eq!(p.advances(9, Some(4_000)), None);
        // Paused or finished.
        assert_eq!(p.advances(7, None), None);
        assert_eq!(Progress::default().advances(0, Some(1)), None);
    }
}
