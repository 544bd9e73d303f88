//! Which offset a worker may commit: never past a run that has not finished. Pure.
//!
//! A partition is tracked from its assignment to its revocation. Each assignment gets a new
//! generation, and a record taken is named by a [`Taken`] that carries it, so a run that
//! outlives its partition's revocation cannot touch the state of a later assignment of it.
//! Between revocation and `forget`, no run of the partition may start: a record taken but not
//! started is handed back (it stays open, so no commit passes it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

/// Per (topic, partition) assigned here: offsets taken but not finished, those of them started
/// (with the instant each must be done by), and the highest offset taken.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    parts: HashMap<(String, i32), Part>,
    generations: u64,
}

#[derive(Debug, Default)]
struct Part {
    generation: u64,
    open: BTreeSet<i64>,
    running: BTreeMap<i64, Instant>,
    next: i64,
    committed: i64,
    revoked: bool,
}

/// A record taken from one assignment of a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    generation: u64,
}

impl OffsetTracker {
    /// The partition is assigned here: its tracking starts afresh, unless it is still held
    /// (an assignment that repeats it changes nothing).
    pub fn assigned(&mut self, topic: &str, partition: i32) {
        let key = (topic.to_owned(), partition);
        if self.parts.get(&key).is_some_and(|p| !p.revoked) {
            return;
        }
        self.generations += 1;
        let part = Part {
            generation: self.generations,
            ..Part::default()
        };
        self.parts.insert(key, part);
    }

    /// A record fetched; `None` when its partition is not (or no longer) assigned here, and
    /// then it must not run.
    pub fn taken(&mut self, topic: &str, partition: i32, offset: i64) -> Option<Taken> {
        let p = self.parts.get_mut(&(topic.to_owned(), partition))?;
        if p.revoked {
            return None;
        }
        p.open.insert(offset);
        p.next = p.next.max(offset + 1);
        Some(Taken {
            topic: topic.to_owned(),
            partition,
            offset,
            generation: p.generation,
        })
    }

    /// The run of `t` is about to start, to be done by `deadline`. False when its partition
    /// was revoked meanwhile: the run must not start, and its record is handed back.
    pub fn start(&mut self, t: &Taken, deadline: Instant) -> bool {
        match self.part_of(t) {
            Some(p) if !p.revoked && p.open.contains(&t.offset) => {
                p.running.insert(t.offset, deadline);
                true
            }
            _ => false,
        }
    }

    /// The record of `t` is done with (its run finished, or it needs no run).
    pub fn finished(&mut self, t: &Taken) {
        if let Some(p) = self.part_of(t) {
            p.open.remove(&t.offset);
            p.running.remove(&t.offset);
        }
    }

    /// No run of the partition starts from now on; those started may finish.
    pub fn revoke(&mut self, topic: &str, partition: i32) {
        if let Some(p) = self.parts.get_mut(&(topic.to_owned(), partition)) {
            p.revoked = true;
        }
    }

    /// Runs started and not finished on `parts`.
    pub fn running(&self, parts: &[(String, i32)]) -> usize {
        parts
            .iter()
            .filter_map(|k| self.parts.get(k))
            .map(|p| p.running.len())
            .sum()
    }

    /// The latest instant by which a run started on `parts` must be done.
    pub fn latest_deadline(&self, parts: &[(String, i32)]) -> Option<Instant> {
        parts
            .iter()
            .filter_map(|k| self.parts.get(k))
            .flat_map(|p| p.running.values().copied())
            .max()
    }

    /// Offsets safe to commit that moved since the last call: the lowest unfinished offset,
    /// or one past the highest taken when nothing is open.
    pub fn to_commit(&mut self) -> Vec<(String, i32, i64)> {
        let mut out = Vec::new();
        for ((topic, partition), p) in &mut self.parts {
            if let Some(safe) = p.advance_commit() {
                out.push((topic.clone(), *partition, safe));
            }
        }
        out
    }

    /// As [`OffsetTracker::to_commit`], for `parts` only.
    pub fn to_commit_of(&mut self, parts: &[(String, i32)]) -> Vec<(String, i32, i64)> {
        let mut out = Vec::new();
        for k in parts {
            if let Some(safe) = self.parts.get_mut(k).and_then(Part::advance_commit) {
                out.push((k.0.clone(), k.1, safe));
            }
        }
        out
    }

    /// Runs not finished in all.
    pub fn open(&self) -> usize {
        self.parts.values().map(|p| p.open.len()).sum()
    }

    pub fn forget(&mut self, topic: &str, partition: i32) {
        self.parts.remove(&(topic.to_owned(), partition));
    }

    fn part_of(&mut self, t: &Taken) -> Option<&mut Part> {
        self.parts
            .get_mut(&(t.topic.clone(), t.partition))
            .filter(|p| p.generation == t.generation)
    }
}

impl Part {
    /// The offset safe to commit, when it moved since last time.
    fn advance_commit(&mut self) -> Option<i64> {
        let safe = self.open.first().copied().unwrap_or(self.next);
        (safe > self.committed).then(|| {
            self.committed = safe;
            safe
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn commits_stop_below_the_lowest_unfinished_run() {
        let mut t = OffsetTracker::default();
        t.assigned("lane", 0);
        let taken: Vec<Taken> = (10..15).map(|o| t.taken("lane", 0, o).unwrap()).collect();
        t.finished(&taken[0]);
        t.finished(&taken[2]);
        assert_eq!(t.to_commit(), vec![("lane".into(), 0, 11)]);
        t.finished(&taken[1]);
        assert_eq!(t.to_commit(), vec![("lane".into(), 0, 13)]);
        t.finished(&taken[3]);
        t.finished(&taken[4]);
        assert_eq!(t.to_commit(), vec![("lane".into(), 0, 15)]);
        assert!(t.to_commit().is_empty(), "nothing moved");
        assert_eq!(t.open(), 0);
    }

    #[test]
    fn records_of_a_partition_not_assigned_here_are_not_taken() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.taken("lane", 0, 1), None);
        t.assigned("lane", 0);
        let first = t.taken("lane", 0, 1).unwrap();
        t.assigned("lane", 0);
        t.finished(&first);
        assert_eq!(
            t.to_commit(),
            vec![("lane".into(), 0, 2)],
            "a repeated assignment reset it"
        );
        t.revoke("lane", 0);
        assert_eq!(t.taken("lane", 0, 2), None);
        t.forget("lane", 0);
        assert_eq!(t.taken("lane", 0, 2), None);
    }

    #[test]
    fn a_revoked_partition_lets_started_runs_finish_and_hands_back_the_rest() {
        let now = Instant::now();
        let mut t = OffsetTracker::default();
        t.assigned("lane", 0);
        t.assigned("lane", 1);
        let a = t.taken("lane", 0, 5).unwrap();
        let b = t.taken("lane", 0, 6).unwrap();
        let c = t.taken("lane", 0, 7).unwrap();
        let other = t.taken("lane", 1, 3).unwrap();
        assert!(t.start(&a, now + Duration::from_secs(3)));
        assert!(t.start(&b, now + Duration::from_secs(9)));
        assert!(t.start(&other, now + Duration::from_secs(20)));
        let revoked = [("lane".to_owned(), 0)];
        t.revoke("lane", 0);
        // `c` was waiting for a slot: it never starts.
        assert!(!t.start(&c, now));
        assert_eq!(t.running(&revoked), 2);
        assert_eq!(
            t.latest_deadline(&revoked),
            Some(now + Duration::from_secs(9)),
            "the other partition's run is not waited for"
        );
        t.finished(&a);
        t.finished(&b);
        assert_eq!(t.running(&revoked), 0);
        // Committed up to the record handed back, which the next owner runs.
        assert_eq!(t.to_commit_of(&revoked), vec![("lane".into(), 0, 7)]);
        assert!(t.to_commit_of(&revoked).is_empty(), "nothing moved");
        t.forget("lane", 0);
        assert_eq!(t.to_commit(), vec![("lane".into(), 1, 3)]);
    }

    #[test]
    fn a_run_that_outlives_its_assignment_does_not_touch_the_next_one() {
        let now = Instant::now();
        let mut t = OffsetTracker::default();
        t.assigned("lane", 0);
        let stale = t.taken("lane", 0, 4).unwrap();
        assert!(t.start(&stale, now));
        t.revoke("lane", 0);
        t.forget("lane", 0);
        t.assigned("lane", 0);
        let again = t.taken("lane", 0, 4).unwrap();
        t.finished(&stale);
        assert_eq!(
            t.open(),
            1,
            "a stale finish closed a run of the new assignment"
        );
        assert!(t.start(&again, now));
        assert!(!t.start(&stale, now));
        t.finished(&again);
        assert_eq!(t.to_commit(), vec![("lane".into(), 0, 5)]);
    }
}
