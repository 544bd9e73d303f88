//! A consumer group's live members and what each is assigned, asked of the group coordinator
//! (`DescribeConsumerGroups`; for a KIP-848 `consumer` group librdkafka sends
//! `ConsumerGroupDescribe`). rust-rdkafka has no binding for it, so this calls librdkafka's C
//! API directly, through one admin client kept for the purpose.

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::ClientConfig;

use crate::config::Config;

/// One member of the group, as the coordinator sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The member's `client.id` (Tocsin's carry the node id).
    pub client_id: String,
    /// The coordinator's id for the member.
    pub member_id: String,
    /// The partitions it holds, as (topic, partition).
    pub assigned: Vec<(String, i32)>,
}

/// Why a group could not be described.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not describe consumer group {group}: {reason}")]
pub struct DescribeError {
    pub group: String,
    pub reason: String,
}

/// How long the metadata request before each description may take: none is asked while no
/// broker answers.
const REACH_TIMEOUT: Duration = Duration::from_secs(2);
/// How many times a description's timeout (and a second) is waited for its answer.
const ANSWER_WAITS: u32 = 10;

/// Describes consumer groups through a client of its own.
pub struct GroupDescriber {
    admin: AdminClient<super::client::NodeContext>,
}

impl GroupDescriber {
    pub fn new(
        config: &Config,
        client_id: &str,
    ) -> Result<GroupDescriber, rdkafka::error::KafkaError> {
        let mut c: ClientConfig = super::base_config(config);
        c.set("client.id", client_id);
        Ok(GroupDescriber {
            admin: c.create_with_context(super::client::NodeContext)?,
        })
    }

    /// The members of `group` now; an empty list for a group with none (or none yet).
    ///
    /// Asked only once a metadata request for `probe_topic` is answered, and the call waits
    /// for librdkafka's own answer, which comes by `timeout` (as an error when the request
    /// timed out), and never tears its queue down before: an admin request left behind while
    /// no broker answers is where librdkafka asserts (`eonce->refcnt > 0`).
    pub fn members(
        &self,
        group: &str,
        probe_topic: &str,
        timeout: Duration,
    ) -> Result<Vec<Member>, DescribeError> {
        let fail = |reason: String| DescribeError {
            group: group.to_owned(),
            reason,
        };
        let probe = self
            .admin
            .inner()
            .fetch_metadata(Some(probe_topic), REACH_TIMEOUT);
        if let Err(e) = probe {
            return Err(fail(format!("not asked: no broker answers ({e})")));
        }
        let name = CString::new(group).map_err(|e| fail(e.to_string()))?;
        let rk = self.admin.inner().native_ptr();
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: every pointer passed to librdkafka is live for the call (`name`, `groups`,
        // the options and the queue, destroyed below, after the event is); what librdkafka
        // returns is read only while the event that owns it is alive.
        unsafe {
            let options = rd::rd_kafka_AdminOptions_new(
                rk,
                rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS,
            );
            let mut errstr = [0 as c_char; 256];
            rd::rd_kafka_AdminOptions_set_request_timeout(
                options,
                ms,
                errstr.as_mut_ptr(),
                errstr.len(),
            );
            let queue = rd::rd_kafka_queue_new(rk);
            let mut groups = [name.as_ptr()];
            rd::rd_kafka_DescribeConsumerGroups(rk, groups.as_mut_ptr(), 1, options, queue);
            rd::rd_kafka_AdminOptions_destroy(options);
            // The request times out on its own after `ms`, and its answer then says so.
            let mut event = std::ptr::null_mut();
            for _ in 0..ANSWER_WAITS {
                event = rd::rd_kafka_queue_poll(queue, ms.saturating_add(1_000));
                if !event.is_null() {
                    break;
                }
            }
            if event.is_null() {
                // Not answered, even late: the queue is left to librdkafka rather than
                // destroyed under a request that may still answer into it.
                return Err(fail(format!(
                    "no answer within {ANSWER_WAITS} × {timeout:?}"
                )));
            }
            let answer = read_answer(event).map_err(fail);
            rd::rd_kafka_event_destroy(event);
            rd::rd_kafka_queue_destroy(queue);
            answer
        }
    }
}

/// Reads the members out of a `DescribeConsumerGroups` result event.
///
/// # Safety
/// `event` must be a live event of a `DescribeConsumerGroups` request for one group.
unsafe fn read_answer(event: *mut rd::rd_kafka_event_t) -> Result<Vec<Member>, String> {
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    if rd::rd_kafka_event_error(event) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Err(text(rd::rd_kafka_event_error_string(event)));
    }
    let result = rd::rd_kafka_event_DescribeConsumerGroups_result(event);
    if result.is_null() {
        return Err("the answer is not a group description".into());
    }
    let mut count = 0usize;
    let groups = rd::rd_kafka_DescribeConsumerGroups_result_groups(result, &mut count);
    if count == 0 || groups.is_null() {
        return Err("the answer describes no group".into());
    }
    let g = *groups;
    let error = rd::rd_kafka_ConsumerGroupDescription_error(g);
    if !error.is_null()
        && rd::rd_kafka_error_code(error) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
    {
        // A group that does not exist (yet) has no members.
        if rd::rd_kafka_error_code(error)
            == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_GROUP_ID_NOT_FOUND
        {
            return Ok(Vec::new());
        }
        return Err(text(rd::rd_kafka_error_string(error)));
    }
    let mut members = Vec::new();
    for i in 0..rd::rd_kafka_ConsumerGroupDescription_member_count(g) {
        let m = rd::rd_kafka_ConsumerGroupDescription_member(g, i);
        if m.is_null() {
            continue;
        }
        let mut assigned = Vec::new();
        let assignment = rd::rd_kafka_MemberDescription_assignment(m);
        if !assignment.is_null() {
            let list = rd::rd_kafka_MemberAssignment_partitions(assignment);
            if !list.is_null() {
                let list = &*list;
                for j in 0..list.cnt.max(0) as usize {
                    let e = &*list.elems.add(j);
                    assigned.push((text(e.topic), e.partition));
                }
            }
        }
        members.push(Member {
            client_id: text(rd::rd_kafka_MemberDescription_client_id(m)),
            member_id: text(rd::rd_kafka_MemberDescription_consumer_id(m)),
            assigned,
        });
    }
    Ok(members)
}
