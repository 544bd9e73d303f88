//! What a takeover waits on, and how it stops waiting: the group's membership (who is alive,
//! who held which partition) and the committed-offset fetch that starts every restore.
//!
//! A node that dies mid-transaction leaves that transaction open. Until it ends, the new
//! owner's offset fetch for the partitions it carried offsets of is answered
//! `UNSTABLE_OFFSET_COMMIT` (librdkafka retries it), and the new owner's replay of `timers` is
//! held short of its mark. The broker ends it only after `transaction.timeout.ms` and its abort sweep.
//! Fencing the dead node's transactional id ends it at once. Which node to fence comes from the
//! group: [`Roster`] remembers who held each partition, and fences only a node the group no
//! longer has as a member, so a live node is never fenced.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::kafka::group::GroupDescriber;

/// How often the group's members are described (and at once when a takeover asks).
pub const DESCRIBE_EVERY: Duration = Duration::from_secs(2);
/// A description's request timeout.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
/// A node fenced this recently is not fenced again (its abort is still being written).
const FENCE_AGAIN_AFTER: Duration = Duration::from_secs(10);

/// The `client.id` of a scheduler's group member: its fleet's topic prefix, `scheduler.`, and
/// its node id (the same string as its transactional id), so the members of one fleet are told
/// from another's that shares the group.
pub fn member_client_id(config: &Config, node_id: &str) -> String {
    format!("{}scheduler.{node_id}", config.topic_prefix)
}

/// The group as last described: its members (node ids) and, per `jobs` partition, who held it.
#[derive(Debug, Default)]
pub struct Roster {
    /// When the members were last described; `None` before the first answer.
    described_at: Option<Instant>,
    members: BTreeSet<String>,
    /// Per partition, the node last seen holding it, and the one seen holding it before.
    holders: BTreeMap<i32, (String, Option<String>)>,
}

impl Roster {
    /// Takes in a description made at `at`: each member's node id and its `jobs` partitions.
    pub fn observe(&mut self, at: Instant, members: &[(String, Vec<i32>)]) {
        self.described_at = Some(at);
        self.members = members.iter().map(|(n, _)| n.clone()).collect();
        for (node, parts) in members {
            for p in parts {
                match self.holders.get_mut(p) {
                    Some((last, _)) if last == node => {}
                    Some((last, before)) => {
                        *before = Some(std::mem::replace(last, node.clone()));
                    }
                    None => {
                        self.holders.insert(*p, (node.clone(), None));
                    }
                }
            }
        }
    }

    /// Who held `p` before `me`: the last holder seen, or the one before it if that is `me`.
    pub fn previous_holder(&self, p: i32, me: &str) -> Option<&str> {
        let (last, before) = self.holders.get(&p)?;
        if last != me {
            Some(last)
        } else {
            before.as_deref().filter(|b| *b != me)
        }
    }

    /// Whether `node` is a member of the group in a description made after `since`: `None`
    /// when there is none that recent, so the answer is not known.
    pub fn is_member(&self, node: &str, since: Instant) -> Option<bool> {
        let at = self.described_at?;
        (at >= since).then(|| self.members.contains(node))
    }
}

/// The node fences to do for a partition restoring since `since` whose restore is blocked:
/// of its candidate previous owners (`candidates`), those the group, described since
/// `since`, no longer has. `None` while no description that recent is in.
pub fn to_fence(
    roster: &Roster,
    me: &str,
    candidates: impl IntoIterator<Item = String>,
    since: Instant,
) -> Option<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for c in candidates {
        if c == me {
            continue;
        }
        if !roster.is_member(&c, since)? {
            out.insert(c);
        }
    }
    Some(out)
}

/// Describes the scheduler group every [`DESCRIBE_EVERY`] on a thread of its own, into a
/// shared [`Roster`].
pub struct Membership {
    roster: Arc<Mutex<Roster>>,
    stop: Arc<AtomicBool>,
    /// Wakes the thread for a description now.
    wake: mpsc::Sender<()>,
}

impl Membership {
    pub fn start(config: &Config, node_id: &str, jobs_topic: &str) -> Membership {
        let roster = Arc::new(Mutex::new(Roster::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (out, stopped) = (roster.clone(), stop.clone());
        let (wake, woken) = mpsc::channel::<()>();
        let group = config.scheduler.group_id.clone();
        let fleet = member_client_id(config, "");
        let jobs = jobs_topic.to_owned();
        let describer = GroupDescriber::new(config, &format!("tocsin-membership-{node_id}"));
        let spawned = std::thread::Builder::new()
            .name("membership".into())
            .spawn(move || {
                let describer = match describer {
                    Ok(d) => d,
                    Err(e) => {
                        warn!(error = %e, "no group membership: departed owners are not fenced");
                        return;
                    }
                };
                let mut failing = false;
                while !stopped.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    match describer.members(&group, &jobs, DESCRIBE_TIMEOUT) {
                        Ok(members) => {
                            failing = false;
                            let members: Vec<(String, Vec<i32>)> = members
                                .into_iter()
                                .filter_map(|m| {
                                    let node = m.client_id.strip_prefix(&fleet)?;
                                    let parts = (m.assigned.iter())
                                        .filter(|(t, _)| *t == jobs)
                                        .map(|(_, p)| *p)
                                        .collect();
                                    Some((node.to_owned(), parts))
                                })
                                .collect();
                            out.lock().unwrap().observe(asked, &members);
                        }
                        Err(e) if !failing => {
                            failing = true;
                            warn!(error = %e, "group membership unknown; retrying");
                        }
                        Err(e) => debug!(error = %e, "group membership still unknown"),
                    }
                    let left = DESCRIBE_EVERY.saturating_sub(asked.elapsed());
                    match woken.recv_timeout(left) {
                        Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {
                            while woken.try_recv().is_ok() {}
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "could not start the membership thread");
        }
        Membership { roster, stop, wake }
    }

    /// Asks for a description now (a takeover wants one made after its assignment).
    pub fn refresh(&self) {
        let _ = self.wake.send(());
    }

    /// `f` of the roster as last described, under its lock (no copy of it is made).
    pub fn with_roster<R>(&self, f: impl FnOnce(&Roster) -> R) -> R {
        f(&self.roster.lock().unwrap())
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What set a fence off: the `trigger` label of `tocsin_fences_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The group, described after the assignment, no longer has the partition's previous
    /// holder: fenced at once, before anything of the restore waits on it. A node killed
    /// while its transaction held only lane and `runs` partitions (its offsets not sent yet)
    /// blocks neither the offset fetch nor the replay, but holds every lane.
    Departed,
    /// The committed-offset fetch was not answered within `FETCH_HELD_AFTER`.
    OffsetFetchHeld,
    /// The replay had not reached its mark within `lifecycle::FENCE_AFTER`.
    ReplayLate,
}

impl Trigger {
    pub const ALL: [Trigger; 3] = [
        Trigger::Departed,
        Trigger::OffsetFetchHeld,
        Trigger::ReplayLate,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Trigger::Departed => "departed",
            Trigger::OffsetFetchHeld => "offset_fetch_held",
            Trigger::ReplayLate => "replay_late",
        }
    }
}

/// A partition restoring here whose previous owner may need fencing.
#[derive(Debug, Clone)]
pub struct Held {
    pub partition: i32,
    /// When its restore started: only a description made since then can say its previous
    /// owner left.
    pub since: Instant,
    /// The previous owner barriers replayed name, if any (written by earlier versions).
    pub barrier_owner: Option<String>,
}

/// Decides whom to fence and does it, on a thread per fence: the group's membership, the
/// partitions whose previous holder is still to be checked, and the fences done recently.
pub struct Fencer {
    config: Config,
    me: String,
    membership: Membership,
    /// Partitions assigned whose previous holder has not been checked against a description
    /// made since (partition → restore start).
    unchecked: BTreeMap<i32, Instant>,
    /// Previous owners fenced, and when.
    fenced: BTreeMap<String, Instant>,
}

impl Fencer {
    pub fn start(config: &Config, me: &str, jobs_topic: &str) -> Fencer {
        Fencer {
            config: config.clone(),
            me: me.to_owned(),
            membership: Membership::start(config, me, jobs_topic),
            unchecked: BTreeMap::new(),
            fenced: BTreeMap::new(),
        }
    }

    /// Partitions were just assigned (restores starting at `at`): their previous holders are
    /// checked once the group has been described since, and a description is asked now.
    pub fn assigned(&mut self, partitions: &[i32], at: Instant) {
        for p in partitions {
            self.unchecked.insert(*p, at);
        }
        if !partitions.is_empty() {
            self.membership.refresh();
        }
    }

    /// `p` is no longer restoring here (active, or given up).
    pub fn settled(&mut self, p: i32) {
        self.unchecked.remove(&p);
    }

    /// Fences the previous holders of the partitions assigned that the group, described since
    /// their assignment, no longer has (`Trigger::Departed`). Each partition is checked once;
    /// one whose answer is not known yet stays for the next call.
    pub fn fence_departed_holders(&mut self) {
        if self.unchecked.is_empty() {
            return;
        }
        let held: Vec<Held> = (self.unchecked.iter())
            .map(|(p, since)| Held {
                partition: *p,
                since: *since,
                barrier_owner: None,
            })
            .collect();
        let (owners, unknown) = self.departed(&held);
        self.unchecked.retain(|p, _| unknown.contains(p));
        self.fence(owners, held.len() - unknown.len(), Trigger::Departed);
    }

    /// Fences the departed previous owners of restoring partitions that are blocked.
    pub fn fence_held(&mut self, held: &[Held], trigger: Trigger) {
        let (owners, unknown) = self.departed(held);
        if !unknown.is_empty() {
            debug!(
                partitions = unknown.len(),
                trigger = trigger.label(),
                "restore held; group membership since the assignment not known yet"
            );
        }
        self.fence(owners, held.len(), trigger);
    }

    fn departed(&self, held: &[Held]) -> (BTreeSet<String>, BTreeSet<i32>) {
        self.membership
            .with_roster(|roster| departed(roster, &self.me, held))
    }

    /// Fences each of `owners` on a thread of its own, at most once per `FENCE_AGAIN_AFTER`.
    fn fence(&mut self, owners: BTreeSet<String>, partitions: usize, trigger: Trigger) {
        for owner in owners {
            let recent =
                (self.fenced.get(&owner)).is_some_and(|at| at.elapsed() < FENCE_AGAIN_AFTER);
            if recent {
                continue;
            }
            self.fenced.insert(owner.clone(), Instant::now());
            info!(owner = %owner, trigger = trigger.label(), partitions, "fencing a departed owner");
            let (config, me) = (self.config.clone(), self.me.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("fence-{owner}"))
                .spawn(move || super::producer::fence_owner(&config, &me, &owner, trigger));
            if let Err(e) = spawned {
                warn!(error = %e, "could not start the fencing thread");
            }
        }
    }
}

/// The departed previous owners of `held` (those the group's descriptions saw holding them,
/// and those barriers replayed name), and the partitions no description since their assignment
/// can answer for yet. `me` is never among them.
fn departed(roster: &Roster, me: &str, held: &[Held]) -> (BTreeSet<String>, BTreeSet<i32>) {
    let mut owners = BTreeSet::new();
    let mut unknown = BTreeSet::new();
    for h in held {
        let candidates: BTreeSet<String> = (roster.previous_holder(h.partition, me))
            .map(str::to_owned)
            .into_iter()
            .chain(h.barrier_owner.clone())
            .collect();
        match to_fence(roster, me, candidates, h.since) {
            Some(gone) => owners.extend(gone),
            None => {
                unknown.insert(h.partition);
            }
        }
    }
    (owners, unknown)
}

/// The committed offsets of newly assigned partitions, fetched on a thread of its own, so a
/// fetch the broker holds (`UNSTABLE_OFFSET_COMMIT`, retried by librdkafka) never stalls the
/// firing of the partitions already active. One fetch at a time.
pub struct OffsetFetch<T, A> {
    pending: Option<Pending<T, A>>,
    /// After a failed fetch, when the next may start.
    retry_at: Option<Instant>,
}

struct Pending<T, A> {
    /// What the caller asked for, given back with the answer.
    of: T,
    started: Instant,
    answer: Receiver<Result<A, KafkaError>>,
}

/// Where the fetch stands.
pub enum Fetched<T, A> {
    /// None is in flight.
    Idle,
    /// One is in flight since `since`.
    Waiting { since: Instant },
    /// The answer to the fetch of `of`, after `took`.
    Done {
        of: T,
        took: Duration,
        answer: Result<A, KafkaError>,
    },
}

impl<T, A> Default for OffsetFetch<T, A> {
    fn default() -> Self {
        OffsetFetch {
            pending: None,
            retry_at: None,
        }
    }
}

impl<T, A> OffsetFetch<T, A> {
    /// What the fetch in flight is for.
    pub fn in_flight(&self) -> Option<&T> {
        self.pending.as_ref().map(|p| &p.of)
    }

    /// Whether a fetch may start now: none is in flight, and a failed one's pause is over.
    pub fn can_start(&self) -> bool {
        self.pending.is_none() && self.retry_at.is_none_or(|at| Instant::now() >= at)
    }

    /// The fetch that just ended failed: the next starts no sooner than `after`.
    pub fn retry_after(&mut self, after: Duration) {
        self.retry_at = Some(Instant::now() + after);
    }

    /// Starts `fetch` (the committed offsets, and what must follow them at once) on a thread
    /// of its own, remembering `of`.
    pub fn start(&mut self, fetch: impl FnOnce() -> Result<A, KafkaError> + Send + 'static, of: T)
    where
        A: Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("offset-fetch".into())
            .spawn(move || {
                let _ = tx.send(fetch());
            });
        match spawned {
            Ok(_) => {
                self.retry_at = None;
                self.pending = Some(Pending {
                    of,
                    started: Instant::now(),
                    answer: rx,
                })
            }
            Err(e) => warn!(error = %e, "could not start the offset fetch"),
        }
    }

    /// The fetch's state; an answer is handed out once.
    pub fn poll(&mut self) -> Fetched<T, A> {
        let Some(p) = &self.pending else {
            return Fetched::Idle;
        };
        match p.answer.try_recv() {
            Err(TryRecvError::Empty) => Fetched::Waiting { since: p.started },
            got => {
                let p = self.pending.take().expect("pending above");
                Fetched::Done {
                    of: p.of,
                    took: p.started.elapsed(),
                    answer: got.unwrap_or(Err(KafkaError::Canceled)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(r: &mut Roster, at: Instant, members: &[(&str, &[i32])]) {
        let m: Vec<(String, Vec<i32>)> = members
            .iter()
            .map(|(n, p)| (n.to_string(), p.to_vec()))
            .collect();
        r.observe(at, &m);
    }

    #[test]
    fn the_previous_holder_is_the_one_before_us() {
        let t0 = Instant::now();
        let mut r = Roster::default();
        described(&mut r, t0, &[("n1", &[0, 1]), ("n2", &[2])]);
        // n1 died: its partitions unassigned for a while, then ours.
        described(&mut r, t0, &[("n2", &[2])]);
        described(&mut r, t0, &[("n2", &[0, 1, 2])]);
        assert_eq!(r.previous_holder(0, "n2"), Some("n1"));
        assert_eq!(r.previous_holder(1, "n2"), Some("n1"));
        // Ours all along: no previous holder.
        assert_eq!(r.previous_holder(2, "n2"), None);
        // Seen only with its old holder (we have not been described holding it yet).
        let mut r = Roster::default();
        described(&mut r, t0, &[("n1", &[5])]);
        assert_eq!(r.previous_holder(5, "n2"), Some("n1"));
        assert_eq!(r.previous_holder(6, "n2"), None);
    }

    #[test]
    fn only_a_node_the_group_no_longer_has_is_fenced() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(2);
        let mut r = Roster::default();
        described(&mut r, t0, &[("n1", &[0]), ("n2", &[1]), ("n3", &[2])]);
        // Nothing described since the restore started: not known yet.
        assert_eq!(to_fence(&r, "n2", ["n1".to_string()], later), None);
        described(&mut r, later, &[("n2", &[0, 1]), ("n3", &[2])]);
        let fence = to_fence(&r, "n2", ["n1".into(), "n3".into(), "n2".into()], later);
        // n3 is alive (never fenced), n2 is us, n1 left the group.
        assert_eq!(fence, Some(BTreeSet::from(["n1".to_string()])));
    }

    #[test]
    fn a_node_back_in_the_group_is_not_fenced() {
        let t0 = Instant::now();
        let mut r = Roster::default();
        described(&mut r, t0, &[("n1", &[0]), ("n2", &[1])]);
        described(&mut r, t0, &[("n2", &[0, 1])]);
        // n1 restarted (its own init fenced its old transaction) and rejoined.
        let t1 = t0 + Duration::from_secs(1);
        described(&mut r, t1, &[("n1", &[]), ("n2", &[0, 1])]);
        assert_eq!(
            to_fence(
                &r,
                "n2",
                [r.previous_holder(0, "n2").unwrap().to_owned()],
                t1
            ),
            Some(BTreeSet::new())
        );
    }

    #[test]
    fn departed_holders_and_barrier_owners_are_fenced_once_the_group_is_described() {
        let t0 = Instant::now();
        let assigned = t0 + Duration::from_secs(1);
        let mut r = Roster::default();
        described(&mut r, t0, &[("n1", &[0, 1]), ("n2", &[2]), ("n3", &[3])]);
        let held = |p: i32, barrier: Option<&str>| Held {
            partition: p,
            since: assigned,
            barrier_owner: barrier.map(str::to_owned),
        };
        let all = [
            held(0, None),
            held(1, None),
            held(2, None),
            held(4, Some("n9")),
        ];
        // No description since the assignment: nothing fenced, and the partitions that have a
        // candidate are not known yet (2 was ours all along: it has none, nothing to wait for).
        let (owners, unknown) = departed(&r, "n2", &all);
        assert!(owners.is_empty());
        assert_eq!(unknown, BTreeSet::from([0, 1, 4]));
        // n1 left; n2 (us) now holds its partitions; n3 lives; partition 4 was only ever named
        // by a barrier of n9, which is not a member.
        described(&mut r, assigned, &[("n2", &[0, 1, 2]), ("n3", &[3])]);
        let (owners, unknown) = departed(&r, "n2", &all);
        assert_eq!(owners, BTreeSet::from(["n1".to_string(), "n9".to_string()]));
        assert!(unknown.is_empty());
        // A partition taken from a live node (a scale-out) fences nobody.
        described(&mut r, assigned, &[("n2", &[0, 1, 2, 3]), ("n3", &[])]);
        let (owners, _) = departed(&r, "n2", &[held(3, None)]);
        assert!(owners.is_empty(), "{owners:?}");
    }
}
