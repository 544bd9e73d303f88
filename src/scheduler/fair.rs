//! Fair ordering of due runs across tenants: one tenant's herd never sits in front of another
//! tenant's runs. Pure.

use std::collections::{BTreeMap, VecDeque};

use super::store::DueEntry;

/// Orders due entries round-robin across tenants (each tenant's own entries earliest first;
/// tenants in the order of their earliest entry), so any prefix of the result, and so the first
/// transaction of a herd, holds runs of every tenant that has any due.
pub fn interleave_by_tenant(entries: Vec<DueEntry>) -> Vec<DueEntry> {
    let total = entries.len();
    let mut by_tenant: BTreeMap<String, Vec<DueEntry>> = BTreeMap::new();
    for e in entries {
        by_tenant.entry(e.tenant.clone()).or_default().push(e);
    }
    let mut queues: Vec<VecDeque<DueEntry>> = by_tenant
        .into_values()
        .map(|mut v| {
            v.sort_by_key(|e| e.wake_ms);
            VecDeque::from(v)
        })
        .collect();
    queues.sort_by_key(|q| q.front().map(|e| e.wake_ms));
    let mut out = Vec::with_capacity(total);
    while !queues.is_empty() {
        queues.retain_mut(|q| match q.pop_front() {
            Some(e) => {
                out.push(e);
                true
            }
            None => false,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tenant: &str, wake_ms: i64, job: &str) -> DueEntry {
        DueEntry {
            partition: 0,
            wake_ms,
            job: job.into(),
            tenant: tenant.into(),
        }
    }

    #[test]
    fn a_flooding_tenant_does_not_delay_the_others() {
        let mut entries: Vec<DueEntry> = (0..10_000)
            .map(|i| entry("big", 1_000, &format!("b{i}")))
            .collect();
        entries.push(entry("small", 1_000, "s1"));
        entries.push(entry("other", 1_000, "o1"));
        let ordered = interleave_by_tenant(entries);
        assert_eq!(ordered.len(), 10_002);
        let first: Vec<&str> = ordered[..3].iter().map(|e| e.tenant.as_str()).collect();
        assert!(
            first.contains(&"small") && first.contains(&"other"),
            "{first:?}"
        );
    }

    #[test]
    fn keeps_every_entry_and_each_tenants_order() {
        let entries = vec![
            entry("a", 3, "a3"),
            entry("b", 1, "b1"),
            entry("a", 1, "a1"),
            entry("a", 2, "a2"),
        ];
        let ordered = interleave_by_tenant(entries);
        let jobs: Vec<&str> = ordered.iter().map(|e| e.job.as_str()).collect();
        assert_eq!(jobs, ["a1", "b1", "a2", "a3"]);
    }
}
