//! A read-only view of what the node's engine holds, for the job API (`api`) and the node's
//! heartbeat: which partitions it owns and whether each is active, and its RocksDB store.
//!
//! It owns nothing the engine relies on: the engine publishes into it once per step
//! ([`View::publish`]) and the view only reads the store's read-only methods, never the ones
//! that move the scan floors or write. A reader on another thread sees the store as of the
//! engine's last applied batch: committed state, never a transaction in flight.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::store::{Result, Store};
use crate::model::records::TimerState;

#[derive(Default)]
pub struct View {
    store: OnceLock<Arc<Store>>,
    /// Owned partitions of `jobs`, and whether each is active (restored and firing).
    partitions: Mutex<BTreeMap<i32, bool>>,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("partitions", &*self.partitions.lock().unwrap())
            .finish_non_exhaustive()
    }
}

/// Where a partition stands on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    Active,
    Restoring,
    NotOwned,
}

impl View {
    /// Called by the engine once, with the store it opened.
    pub fn attach(&self, store: Arc<Store>) {
        let _ = self.store.set(store);
    }

    /// Called by the engine after each step: the partitions it owns and whether each is active.
    pub fn publish(&self, owned: impl Iterator<Item = (i32, bool)>) {
        let mut partitions = self.partitions.lock().unwrap();
        partitions.clear();
        partitions.extend(owned);
    }

    /// The owned partitions, and whether each is active.
    pub fn partitions(&self) -> BTreeMap<i32, bool> {
        self.partitions.lock().unwrap().clone()
    }

    pub fn held(&self, partition: i32) -> Held {
        match self.partitions.lock().unwrap().get(&partition) {
            Some(true) => Held::Active,
            Some(false) => Held::Restoring,
            None => Held::NotOwned,
        }
    }

    fn store(&self) -> Option<&Arc<Store>> {
        self.store.get()
    }

    /// A job's timer, when its partition is active here and the job exists.
    pub fn timer(&self, partition: i32, job: &str) -> Result<Option<TimerState>> {
        if self.held(partition) != Held::Active {
            return Ok(None);
        }
        match self.store() {
            Some(s) => s.timer(partition as u16, job),
            None => Ok(None),
        }
    }

    /// Up to `limit` timers of the active partitions whose id sorts after `after` and that
    /// `keep` accepts, by id. Memory is bounded by `limit`, not by the jobs held.
    pub fn timers(
        &self,
        after: &str,
        limit: usize,
        keep: impl Fn(&TimerState) -> bool,
    ) -> Result<Vec<(i32, TimerState)>> {
        let Some(store) = self.store() else {
            return Ok(Vec::new());
        };
        let mut found: BTreeMap<String, (i32, TimerState)> = BTreeMap::new();
        for (p, active) in self.partitions() {
            if !active {
                continue;
            }
            store.timers_after(p as u16, after, |t| {
                // Each partition is read in id order: past the largest kept, nothing more of
                // this partition can make the first `limit`.
                if found.len() >= limit
                    && found
                        .last_key_value()
                        .is_some_and(|(k, _)| *k < t.definition.id)
                {
                    return false;
                }
                if keep(&t) {
                    found.insert(t.definition.id.clone(), (p, t));
                    if found.len() > limit {
                        found.pop_last();
                    }
                }
                true
            })?;
        }
        Ok(found.into_values().collect())
    }

    /// Runs due in an active partition at `now_ms` and not yet fired, counted up to `cap`.
    pub fn due_backlog(&self, partition: i32, now_ms: i64, cap: usize) -> Result<Option<usize>> {
        if self.held(partition) != Held::Active {
            return Ok(None);
        }
        match self.store() {
            Some(s) => s.count_due(partition as u16, now_ms, cap).map(Some),
            None => Ok(None),
        }
    }
}
