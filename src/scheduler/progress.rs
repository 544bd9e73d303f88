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
//! A tenant's mark (`tenants`) says the same of one tenant's timers: set by a transaction
//! after which every timer of that tenant in the partition is indexed later than its `now`,
//! while another tenant's are still due there. A herd needs it: its first transactions carry
//! every tenant's runs in turn (`fair`), so they fire a small tenant's timers in every partition
//! and the big tenant's in few, and without a tenant's mark each of those fires would be
//! written to `timers`. A restore advances a state by the partition's mark or its tenant's,
//! whichever fires further (each alone holds by the argument above, restricted to a tenant). A
//! partition's mark that fires as far as a tenant's replaces it. Marks are made while the
//! metadata stays within `MAX_ENCODED` bytes; a tenant past it gets no mark, so its fires
//! are written. A node of a version before tenants' marks ignores them (an unknown field),
//! so a partition moved from this version to an older one may fire those runs again.
//!
//! A commit without this metadata (written before Tocsin kept it, or by something else)
//! reads as no progress: nothing is advanced, which is exact for timers that were written at
//! every fire.

use super::fire::Lookahead;
use crate::model::records::TimerState;

/// What a metadata string of ours starts with; the version follows.
const TAG: &str = "tocsin-progress/1";

/// The longest metadata string marks are added to: the broker's `offset.metadata.max.bytes`
/// is 4096 by default, and a tenant's mark is at most 64 + 45 bytes.
pub const MAX_ENCODED: usize = 3_072;

/// The progress of one `jobs` partition, as of its last committed transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The partition's last transaction number.
    pub seq: u64,
    /// The latest transaction after which no timer of the partition woke at or before its
    /// instant.
    pub fired: Option<FiredThrough>,
    /// Per tenant, the latest transaction after which none of its timers in the partition woke
    /// at or before its instant, where that fires further than `fired`. Sorted by tenant.
    pub tenants: Vec<(String, FiredThrough)>,
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
                Some((key, v)) if key.starts_with("t:") => {
                    let tenant = &key[2..];
                    let mut parts = v.split(',');
                    let parsed = (|| {
                        let f = FiredThrough {
                            through_ms: parts.next()?.parse().ok()?,
                            seq: parts.next()?.parse().ok()?,
                            ahead_ms: parts.next()?.parse().ok()?,
                        };
                        (parts.next().is_none() && f.ahead_ms >= 0 && !tenant.is_empty())
                            .then_some(f)
                    })();
                    match parsed {
                        Some(f) => p.tenants.push((tenant.to_owned(), f)),
                        None => return Progress::default(),
                    }
                }
                _ => {} // a later version's field
            }
        }
        if let Some(f) = &mut p.fired {
            f.ahead_ms = ahead;
        }
        p.tenants.sort_by(|a, b| a.0.cmp(&b.0));
        p.tenants.dedup_by(|a, b| a.0 == b.0);
        let later = |f: &FiredThrough| f.seq > p.seq;
        if p.fired.as_ref().is_some_and(later) || p.tenants.iter().any(|(_, f)| later(f)) {
            return Progress::default();
        }
        p
    }

    /// The metadata string: within `MAX_ENCODED` (so well under the broker's
    /// `offset.metadata.max.bytes`, 4096) when tenants' marks were added with `fits`.
    pub fn encode(&self) -> String {
        let mut text = match self.fired {
            Some(f) if f.ahead_ms != 0 => format!(
                "{TAG} seq={} fired={}@{} ahead={}",
                self.seq, f.through_ms, f.seq, f.ahead_ms
            ),
            Some(f) => format!("{TAG} seq={} fired={}@{}", self.seq, f.through_ms, f.seq),
            None => format!("{TAG} seq={}", self.seq),
        };
        for (tenant, f) in &self.tenants {
            text.push_str(&tenant_word(tenant, f));
        }
        text
    }

    /// Whether a mark for `tenant` can be added within `MAX_ENCODED` (and its name, which
    /// validation holds to `[A-Za-z0-9._-]`, cannot break the format).
    pub fn fits(&self, tenant: &str, f: &FiredThrough) -> bool {
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        !tenant.is_empty()
            && tenant.chars().all(plain)
            && self.encode().len() + tenant_word(tenant, f).len() <= MAX_ENCODED
    }

    /// The mark of `tenant`'s timers, if any.
    pub fn tenant(&self, tenant: &str) -> Option<&FiredThrough> {
        (self
            .tenants
            .binary_search_by(|(t, _)| t.as_str().cmp(tenant))
            .ok())
        .map(|i| &self.tenants[i].1)
    }

    /// Sets `tenant`'s mark, keeping `tenants` sorted.
    pub fn set_tenant(&mut self, tenant: &str, f: FiredThrough) {
        match self
            .tenants
            .binary_search_by(|(t, _)| t.as_str().cmp(tenant))
        {
            Ok(i) => self.tenants[i].1 = f,
            Err(i) => self.tenants.insert(i, (tenant.to_owned(), f)),
        }
    }

    /// Whether a restored state, current as of `state_seq`, was fired plainly since it was
    /// written, and through which instant it must be advanced: the mark's `through_ms` plus
    /// its job's lead under the lookahead the mark was made with (which may not be this
    /// node's), by the partition's mark or its tenant's, whichever fires further.
    pub fn advances(&self, state_seq: u64, state: &TimerState) -> Option<i64> {
        let by = |f: &FiredThrough| {
            let ahead = Lookahead::new(f.ahead_ms);
            let wake = ahead.wake(state)?;
            (state_seq < f.seq && wake <= f.through_ms)
                .then(|| ahead.horizon(&state.definition, f.through_ms))
        };
        let partition = self.fired.as_ref().and_then(by);
        let tenant = self.tenant(&state.definition.tenant).and_then(by);
        partition.max(tenant)
    }

    /// The latest index instant a mark may advance a timer from: every mark's through plus
    /// its lead. `None` without marks.
    pub fn reach(&self) -> Option<i64> {
        (self.fired.iter())
            .chain(self.tenants.iter().map(|(_, f)| f))
            .map(|f| f.through_ms.saturating_add(f.ahead_ms))
            .max()
    }
}

fn tenant_word(tenant: &str, f: &FiredThrough) -> String {
    format!(" t:{tenant}={},{},{}", f.through_ms, f.seq, f.ahead_ms)
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
                ..Default::default()
            },
            Progress {
                seq: 12,
                fired: Some(FiredThrough {
                    through_ms: 1_764_000_000_123,
                    seq: 11,
                    ahead_ms: 0,
                }),
                ..Default::default()
            },
            Progress {
                seq: 13,
                fired: Some(FiredThrough {
                    through_ms: 1_764_000_000_123,
                    seq: 13,
                    ahead_ms: 1_000,
                }),
                ..Default::default()
            },
            Progress {
                seq: u64::MAX,
                fired: Some(FiredThrough {
                    through_ms: -5,
                    seq: u64::MAX,
                    ahead_ms: i64::MAX,
                }),
                ..Default::default()
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
            ..Default::default()
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

    fn f(through_ms: i64, seq: u64) -> FiredThrough {
        FiredThrough {
            through_ms,
            seq,
            ahead_ms: 0,
        }
    }

    #[test]
    fn tenants_marks_round_trip_sorted_and_bad_ones_are_no_progress() {
        let mut p = mark(5_000, 8, 0);
        p.set_tenant("zeta", f(6_000, 9));
        p.set_tenant(
            "acme.eu-1",
            FiredThrough {
                ahead_ms: 1_000,
                ..f(7_000, 10)
            },
        );
        p.set_tenant("zeta", f(6_500, 10));
        assert_eq!(
            p.tenants
                .iter()
                .map(|(t, _)| t.as_str())
                .collect::<Vec<_>>(),
            ["acme.eu-1", "zeta"]
        );
        let text = p.encode();
        assert_eq!(
            text,
            "tocsin-progress/1 seq=10 fired=5000@8 t:acme.eu-1=7000,10,1000 t:zeta=6500,10,0"
        );
        assert_eq!(Progress::decode(&text), p);
        assert_eq!(p.tenant("zeta"), Some(&f(6_500, 10)));
        assert_eq!(p.tenant("nobody"), None);
        assert_eq!(p.reach(), Some(8_000));
        assert_eq!(Progress::default().reach(), None);
        for bad in [
            "tocsin-progress/1 seq=3 t:=100,2,0",
            "tocsin-progress/1 seq=3 t:a=100,2",
            "tocsin-progress/1 seq=3 t:a=100,2,0,1",
            "tocsin-progress/1 seq=3 t:a=100,2,-1",
            "tocsin-progress/1 seq=3 t:a=x,2,0",
            // From a later transaction than the last one.
            "tocsin-progress/1 seq=3 fired=100@2 t:a=100,4,0",
        ] {
            assert_eq!(Progress::decode(bad), Progress::default(), "{bad:?}");
        }
    }

    #[test]
    fn a_tenants_mark_advances_its_tenants_states_where_it_fires_further() {
        let mut p = mark(5_000, 8, 0);
        p.set_tenant("t", f(7_000, 9));
        let at = |wake| state(true, wake);
        // By the tenant's mark (later), then by the partition's where only it applies.
        assert_eq!(p.advances(7, &at(4_000)), Some(7_000));
        assert_eq!(p.advances(8, &at(6_000)), Some(7_000));
        assert_eq!(p.advances(9, &at(6_000)), None);
        assert_eq!(p.advances(7, &at(7_001)), None);
        // Another tenant's state goes by the partition's mark alone.
        let mut other = at(4_000);
        other.definition.tenant = "u".into();
        assert_eq!(p.advances(7, &other), Some(5_000));
        other.next_fire_ms = Some(6_000);
        assert_eq!(p.advances(7, &other), None);
    }

    #[test]
    fn tenants_marks_are_added_only_within_the_limit_and_for_plain_names() {
        let mut p = mark(5_000, 8, 0);
        let mut n = 0;
        while p.fits(&format!("tenant-{n:058}"), &f(6_000, 10)) {
            p.set_tenant(&format!("tenant-{n:058}"), f(6_000, 10));
            n += 1;
        }
        assert!(n > 20, "{n}");
        assert!(p.encode().len() <= MAX_ENCODED);
        assert!(!mark(5_000, 8, 0).fits("a b", &f(6_000, 10)));
        assert!(!mark(5_000, 8, 0).fits("a=b", &f(6_000, 10)));
        assert!(!mark(5_000, 8, 0).fits("", &f(6_000, 10)));
    }
}
