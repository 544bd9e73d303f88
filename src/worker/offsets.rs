//! Which offset a worker may commit: never past a run that has not finished. Pure.

use std::collections::{BTreeSet, HashMap};

/// Per (topic, partition): offsets taken but not finished, and the highest offset taken.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    parts: HashMap<(String, i32), Part>,
}

#[derive(Debug, Default)]
struct Part {
    open: BTreeSet<i64>,
    next: i64,
    committed: i64,
}

impl OffsetTracker {
    pub fn taken(&mut self, topic: &str, partition: i32, offset: i64) {
        let p = self.parts.entry((topic.to_owned(), partition)).or_default();
        p.open.insert(offset);
        p.next = p.next.max(offset + 1);
    }

    pub fn finished(&mut self, topic: &str, partition: i32, offset: i64) {
        if let Some(p) = self.parts.get_mut(&(topic.to_owned(), partition)) {
            p.open.remove(&offset);
        }
    }

    /// Offsets safe to commit that moved since the last call: the lowest unfinished offset,
    /// or one past the highest taken when nothing is open.
    pub fn to_commit(&mut self) -> Vec<(String, i32, i64)> {
        let mut out = Vec::new();
        for ((topic, partition), p) in &mut self.parts {
            let safe = p.open.first().copied().unwrap_or(p.next);
            if safe > p.committed {
                p.committed = safe;
                out.push((topic.clone(), *partition, safe));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_stop_below_the_lowest_unfinished_run() {
        let mut t = OffsetTracker::default();
        for o in 10..15 {
            t.taken("lane", 0, o);
        }
        t.finished("lane", 0, 10);
        t.finished("lane", 0, 12);
        assert_eq!(t.to_commit(), vec![("lane".into(), 0, 11)]);
        t.finished("lane", 0, 11);
        assert_eq!(t.to_commit(), vec![("lane".into(), 0, 13)]);
        t.finished("lane", 0, 13);
        t.finished("lane", 0, 14);
        assert_eq!(t.to_commit(), vec![("lane".into(), 0, 15)]);
        assert!(t.to_commit().is_empty(), "nothing moved");
        assert_eq!(t.open(), 0);
    }
}
