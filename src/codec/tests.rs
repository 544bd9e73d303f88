//! Round trips, hostile input, error messages and schema hygiene.

use std::collections::BTreeMap;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;
use proptest::prelude::*;

use super::binary::{write_long, Reader, Shape};
use super::canonical;
use super::convert::AvroEnum;
use super::schema::{all, CompiledSchema, RUN_EVENT};
use super::*;
use crate::model::job::{
    DstGapPolicy, DstRepeatPolicy, HandlerKind, HandlerSpec, JobDefinition, MisfirePolicy,
    OverlapPolicy, RetryPolicy, ScheduleSpec,
};
use crate::model::records::{
    ControlRecord, DeadLetter, FireReason, InFlight, Outcome, PendingFire, Run, RunEvent,
    RunEventKind, TimerState,
};

// ---------- strategies ----------

fn text() -> impl Strategy<Value = String> {
    prop_oneof![".{0,8}", any::<String>()]
}

/// Unsigned values as the schemas carry them: up to `i64::MAX` (larger ones saturate).
fn unsigned() -> impl Strategy<Value = u64> {
    0..=i64::MAX as u64
}

fn string_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(text(), text(), 0..4)
}

fn variant<E: AvroEnum + std::fmt::Debug>() -> impl Strategy<Value = E> {
    prop::sample::select(E::VARIANTS)
}

fn schedule() -> impl Strategy<Value = ScheduleSpec> {
    prop_oneof![
        (text(), text()).prop_map(|(expr, zone)| ScheduleSpec::Cron { expr, zone }),
        (unsigned(), any::<i64>()).prop_map(|(every_ms, anchor_ms)| ScheduleSpec::Interval {
            every_ms,
            anchor_ms
        }),
        any::<i64>().prop_map(|at_ms| ScheduleSpec::Once { at_ms }),
    ]
}

fn handler() -> impl Strategy<Value = HandlerSpec> {
    (
        variant::<HandlerKind>(),
        text(),
        prop::collection::vec(any::<u8>(), 0..32),
        string_map(),
        proptest::option::of(text()),
        prop::collection::vec(text(), 0..3),
    )
        .prop_map(
            |(kind, target, payload, headers, method, args)| HandlerSpec {
                kind,
                target,
                payload,
                headers,
                method,
                args,
            },
        )
}

fn retry() -> impl Strategy<Value = RetryPolicy> {
    (any::<u32>(), unsigned(), unsigned()).prop_map(
        |(max_attempts, backoff_base_ms, backoff_cap_ms)| RetryPolicy {
            max_attempts,
            backoff_base_ms,
            backoff_cap_ms,
        },
    )
}

fn job() -> impl Strategy<Value = JobDefinition> {
    (
        (
            text(),
            text(),
            schedule(),
            proptest::option::of(any::<i64>()),
            proptest::option::of(any::<i64>()),
            proptest::option::of(unsigned()),
            unsigned(),
            variant::<DstGapPolicy>(),
            variant::<DstRepeatPolicy>(),
        ),
        (
            variant::<MisfirePolicy>(),
            unsigned(),
            variant::<OverlapPolicy>(),
            any::<bool>(),
            handler(),
            unsigned(),
            retry(),
            string_map(),
            unsigned(),
        ),
    )
        .prop_map(
            |(
                (id, tenant, schedule, start_ms, end_ms, max_fires, jitter_ms, dst_gap, dst_repeat),
                (
                    misfire,
                    catch_up_window_ms,
                    overlap,
                    paused,
                    handler,
                    timeout_ms,
                    retry,
                    labels,
                    revision,
                ),
            )| JobDefinition {
                id,
                tenant,
                schedule,
                start_ms,
                end_ms,
                max_fires,
                jitter_ms,
                dst_gap,
                dst_repeat,
                misfire,
                catch_up_window_ms,
                overlap,
                paused,
                handler,
                timeout_ms,
                retry,
                labels,
                revision,
            },
        )
}

fn timer() -> impl Strategy<Value = TimerState> {
    let pending = (
        any::<i64>(),
        any::<u32>(),
        any::<i64>(),
        variant::<FireReason>(),
    )
        .prop_map(
            |(scheduled_ms, attempt, not_before_ms, reason)| PendingFire {
                scheduled_ms,
                attempt,
                not_before_ms,
                reason,
            },
        );
    (
        job(),
        proptest::option::of(any::<i64>()),
        unsigned(),
        proptest::option::of(any::<i64>()),
        proptest::option::of((text(), any::<i64>())),
        proptest::option::of(any::<i64>()),
        prop::collection::vec(pending, 0..4),
    )
        .prop_map(
            |(
                definition,
                next_fire_ms,
                fires,
                last_scheduled_ms,
                in_flight,
                buffered_ms,
                pending,
            )| {
                TimerState {
                    definition,
                    next_fire_ms,
                    fires,
                    last_scheduled_ms,
                    in_flight: in_flight.map(|(run_id, scheduled_ms)| InFlight {
                        run_id,
                        scheduled_ms,
                    }),
                    buffered_ms,
                    pending,
                }
            },
        )
}

fn run() -> impl Strategy<Value = Run> {
    (
        text(),
        text(),
        text(),
        any::<i64>(),
        any::<i64>(),
        any::<u32>(),
        variant::<FireReason>(),
        handler(),
        unsigned(),
        retry(),
        string_map(),
    )
        .prop_map(
            |(
                run_id,
                job_id,
                tenant,
                scheduled_ms,
                fire_ms,
                attempt,
                reason,
                handler,
                timeout_ms,
                retry,
                labels,
            )| Run {
                run_id,
                job_id,
                tenant,
                scheduled_ms,
                fire_ms,
                attempt,
                reason,
                handler,
                timeout_ms,
                retry,
                labels,
            },
        )
}

fn control() -> impl Strategy<Value = ControlRecord> {
    prop_oneof![
        (text(), any::<i64>(), any::<u32>(), any::<i64>(), text()).prop_map(
            |(run_id, scheduled_ms, attempt, not_before_ms, error)| ControlRecord::Retry {
                run_id,
                scheduled_ms,
                attempt,
                not_before_ms,
                error
            }
        ),
        (text(), any::<i64>(), any::<u32>(), variant::<Outcome>()).prop_map(
            |(run_id, scheduled_ms, attempt, outcome)| ControlRecord::Completion {
                run_id,
                scheduled_ms,
                attempt,
                outcome
            }
        ),
        any::<i64>().prop_map(|requested_ms| ControlRecord::Trigger { requested_ms }),
        (any::<i64>(), any::<i64>())
            .prop_map(|(from_ms, to_ms)| ControlRecord::Backfill { from_ms, to_ms }),
    ]
}

fn event() -> impl Strategy<Value = RunEvent> {
    (
        text(),
        text(),
        text(),
        any::<i64>(),
        any::<u32>(),
        variant::<RunEventKind>(),
        any::<i64>(),
        text(),
        proptest::option::of(text()),
        proptest::option::of(unsigned()),
    )
        .prop_map(
            |(
                run_id,
                job_id,
                tenant,
                scheduled_ms,
                attempt,
                kind,
                at_ms,
                node,
                error,
                duration_ms,
            )| {
                RunEvent {
                    run_id,
                    job_id,
                    tenant,
                    scheduled_ms,
                    attempt,
                    kind,
                    at_ms,
                    node,
                    error,
                    duration_ms,
                }
            },
        )
}

fn dead() -> impl Strategy<Value = DeadLetter> {
    (run(), text(), any::<u32>(), any::<i64>()).prop_map(|(run, error, attempts, at_ms)| {
        DeadLetter {
            run,
            error,
            attempts,
            at_ms,
        }
    })
}

fn framing() -> impl Strategy<Value = Framing> {
    prop_oneof![
        Just(Framing::SingleObject),
        any::<u32>().prop_map(|schema_id| Framing::Confluent { schema_id }),
    ]
}

// ---------- round trips ----------

/// Our round trip in `framing`, plus the reference implementation reading what we write and
/// writing what we read, and equal records encoding to equal bytes.
fn check_round_trip<T>(v: &T, framing: &Framing) -> Result<(), TestCaseError>
where
    T: AvroRecord + PartialEq + std::fmt::Debug,
{
    let bytes = encode(v, framing);
    let back: T = decode(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&back, v);
    prop_assert_eq!(encode(&back, framing), bytes.clone());

    let header = match framing {
        Framing::SingleObject => SINGLE_OBJECT_HEADER_LEN,
        Framing::Confluent { .. } => CONFLUENT_HEADER_LEN,
    };
    let body = &bytes[header..];
    let value = v.to_avro();
    prop_assert!(value.validate(T::schema()));

    let reference = GenericDatumReader::builder(T::schema())
        .build()
        .unwrap()
        .read_value(&mut &body[..])
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&T::from_avro(reference).unwrap(), v);

    let theirs = GenericDatumWriter::builder(T::schema())
        .build()
        .unwrap()
        .write_value_to_vec(value)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut framed = bytes[..header].to_vec();
    framed.extend_from_slice(&theirs);
    prop_assert_eq!(&decode::<T>(&framed).unwrap(), v);
    Ok(())
}

proptest! {
    #[test]
    fn job_definition_round_trips(v in job(), f in framing()) { check_round_trip(&v, &f)?; }

    #[test]
    fn timer_state_round_trips(v in timer(), f in framing()) { check_round_trip(&v, &f)?; }

    #[test]
    fn run_round_trips(v in run(), f in framing()) { check_round_trip(&v, &f)?; }

    #[test]
    fn control_record_round_trips(v in control(), f in framing()) { check_round_trip(&v, &f)?; }

    #[test]
    fn run_event_round_trips(v in event(), f in framing()) { check_round_trip(&v, &f)?; }

    #[test]
    fn dead_letter_round_trips(v in dead(), f in framing()) { check_round_trip(&v, &f)?; }
}

// ---------- hostile input ----------

/// Decodes `bytes` as every record type; each must return (Ok or Err), never panic.
fn decode_all(bytes: &[u8]) {
    let _ = decode::<JobDefinition>(bytes);
    let _ = decode::<TimerState>(bytes);
    let _ = decode::<Run>(bytes);
    let _ = decode::<ControlRecord>(bytes);
    let _ = decode::<RunEvent>(bytes);
    let _ = decode::<DeadLetter>(bytes);
}

fn single_object_header<T: AvroRecord>() -> Vec<u8> {
    let mut h = vec![0xC3, 0x01];
    h.extend_from_slice(&T::compiled().fingerprint().to_le_bytes());
    h
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    let m = prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(i, x)| Mutation::Flip(i, x)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
        any::<usize>().prop_map(Mutation::Truncate),
    ];
    prop::collection::vec(m, 1..4)
}

fn mutate(mut bytes: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let n = bytes.len().max(1);
        match *m {
            Mutation::Flip(i, x) if !bytes.is_empty() => bytes[i % n] ^= x,
            Mutation::Insert(i, b) => bytes.insert(i % (bytes.len() + 1), b),
            Mutation::Remove(i) if !bytes.is_empty() => {
                bytes.remove(i % n);
            }
            Mutation::Truncate(i) => bytes.truncate(i % n),
            _ => {}
        }
    }
    bytes
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        decode_all(&bytes);
    }

    /// Random bodies behind valid headers, so that the body reader itself is exercised.
    #[test]
    fn random_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
        for mut framed in [
            single_object_header::<JobDefinition>(),
            single_object_header::<TimerState>(),
            single_object_header::<Run>(),
            single_object_header::<ControlRecord>(),
            single_object_header::<RunEvent>(),
            single_object_header::<DeadLetter>(),
            vec![0, 0, 0, 0, 1],
        ] {
            framed.extend_from_slice(&body);
            decode_all(&framed);
        }
    }

    #[test]
    fn mutated_timer_states_never_panic(v in timer(), f in framing(), ms in mutations()) {
        decode_all(&mutate(encode(&v, &f), &ms));
    }

    #[test]
    fn mutated_runs_never_panic(v in dead(), f in framing(), ms in mutations()) {
        decode_all(&mutate(encode(&v.run, &f), &ms));
        decode_all(&mutate(encode(&v, &f), &ms));
    }

    #[test]
    fn mutated_control_and_events_never_panic(
        c in control(), e in event(), f in framing(), ms in mutations()
    ) {
        decode_all(&mutate(encode(&c, &f), &ms));
        decode_all(&mutate(encode(&e, &f), &ms));
    }
}

// ---------- the direct path agrees with the value path ----------

/// Reads a body both ways: both must fail, or both succeed with the same record.
fn check_agreement<T>(body: &[u8]) -> Result<(), TestCaseError>
where
    T: AvroRecord + PartialEq + std::fmt::Debug,
{
    let mut reader = Reader::new(body, 0);
    let direct = T::read_body(&mut reader)
        .ok()
        .filter(|_| reader.left() == 0);
    let value = read_body(T::compiled().shape(), T::compiled().name(), body, 0)
        .and_then(T::from_avro)
        .ok();
    prop_assert_eq!(direct, value);
    Ok(())
}

proptest! {
    #[test]
    fn direct_and_value_paths_agree_on_mutated_timer_states(v in timer(), ms in mutations()) {
        check_agreement::<TimerState>(&mutate(encode(&v, &Framing::Confluent { schema_id: 0 })[5..].to_vec(), &ms))?;
    }

    #[test]
    fn direct_and_value_paths_agree_on_mutated_records(
        d in dead(), c in control(), e in event(), ms in mutations()
    ) {
        let f = Framing::Confluent { schema_id: 0 };
        check_agreement::<DeadLetter>(&mutate(encode(&d, &f)[5..].to_vec(), &ms))?;
        check_agreement::<Run>(&mutate(encode(&d.run, &f)[5..].to_vec(), &ms))?;
        check_agreement::<ControlRecord>(&mutate(encode(&c, &f)[5..].to_vec(), &ms))?;
        check_agreement::<RunEvent>(&mutate(encode(&e, &f)[5..].to_vec(), &ms))?;
    }

    #[test]
    fn direct_and_value_paths_agree_on_random_bodies(body in prop::collection::vec(any::<u8>(), 0..64)) {
        check_agreement::<JobDefinition>(&body)?;
        check_agreement::<TimerState>(&body)?;
        check_agreement::<ControlRecord>(&body)?;
        check_agreement::<RunEvent>(&body)?;
    }
}

// ---------- errors, one by one ----------

fn sample_event() -> RunEvent {
    RunEvent {
        run_id: "r1".into(),
        job_id: "j1".into(),
        tenant: "t".into(),
        scheduled_ms: 1_000,
        attempt: 1,
        kind: RunEventKind::Fired,
        at_ms: 1_001,
        node: "n1".into(),
        error: None,
        duration_ms: None,
    }
}

fn err<T: AvroRecord + std::fmt::Debug>(bytes: &[u8]) -> String {
    decode::<T>(bytes).unwrap_err().to_string()
}

#[test]
fn empty_input_is_refused() {
    assert!(matches!(
        decode::<RunEvent>(&[]),
        Err(CodecError::Empty { .. })
    ));
    assert_eq!(
        err::<RunEvent>(&[]),
        "empty input for io.tocsin.RunEvent: expected a single-object header (c3 01) or a confluent magic byte (00)"
    );
}

#[test]
fn wrong_magic_is_refused() {
    assert_eq!(
        err::<Run>(b"{\"json\": true}"),
        "unknown framing of io.tocsin.Run: first bytes 7b 22 are neither the single-object marker c3 01 nor the confluent magic byte 00"
    );
    assert_eq!(
        err::<Run>(&[0xC3, 0x02, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
        "unknown framing of io.tocsin.Run: first bytes c3 02 are neither the single-object marker c3 01 nor the confluent magic byte 00"
    );
}

#[test]
fn truncated_headers_are_refused() {
    assert_eq!(
        err::<RunEvent>(&[0xC3, 0x01, 0xAA]),
        "truncated single-object header of io.tocsin.RunEvent: 3 bytes, need 10"
    );
    assert_eq!(
        err::<RunEvent>(&[0x00, 0, 1]),
        "truncated confluent header of io.tocsin.RunEvent: 3 bytes, need 5"
    );
}

#[test]
fn another_schema_fingerprint_is_refused_naming_both() {
    let bytes = encode(&sample_event(), &Framing::SingleObject);
    let e = decode::<Run>(&bytes).unwrap_err();
    let CodecError::FingerprintMismatch {
        found, expected, ..
    } = e
    else {
        panic!("{e}")
    };
    assert_eq!(found, RunEvent::compiled().fingerprint());
    assert_eq!(expected, Run::compiled().fingerprint());
    assert_eq!(
        e.to_string(),
        format!(
            "schema fingerprint {found:016x} of the data does not match our io.tocsin.Run schema, fingerprint {expected:016x}, nor any earlier version of it"
        )
    );
}

#[test]
fn truncated_body_is_refused_naming_the_field() {
    let bytes = encode(&sample_event(), &Framing::SingleObject);
    // Cut inside "node": header 10, then r1 j1 t (3+3+2), 1000 (2), 1 (1), kind (1), 1001 (2),
    // then node's length byte (at 24) and one of its two bytes.
    let cut = &bytes[..10 + 8 + 2 + 1 + 1 + 2 + 2];
    assert_eq!(
        err::<RunEvent>(cut),
        "malformed io.tocsin.RunEvent at byte 24 (field node): string length 2 exceeds the 1 bytes left"
    );
    assert_eq!(
        err::<RunEvent>(&bytes[..bytes.len() - 1]),
        "malformed io.tocsin.RunEvent at byte 28 (field duration_ms): truncated, 1 bytes needed, 0 left"
    );
}

#[test]
fn trailing_garbage_is_refused() {
    let mut bytes = encode(&sample_event(), &Framing::Confluent { schema_id: 7 });
    let len = bytes.len();
    bytes.extend_from_slice(&[1, 2, 3]);
    assert_eq!(
        err::<RunEvent>(&bytes),
        format!("3 trailing bytes after the io.tocsin.RunEvent body at byte {len}")
    );
}

#[test]
fn enum_index_out_of_range_is_refused() {
    let mut bytes = encode(&sample_event(), &Framing::SingleObject);
    let kind_at = 10 + 8 + 2 + 1;
    assert_eq!(bytes[kind_at], 0); // fired
    bytes[kind_at] = 16; // zigzag 8: one past "skipped"
    assert_eq!(
        err::<RunEvent>(&bytes),
        "malformed io.tocsin.RunEvent at byte 21 (field kind): enum index 8 out of range 0..8 of io.tocsin.RunEventKind"
    );
    bytes[kind_at] = 1; // zigzag -1
    assert!(err::<RunEvent>(&bytes).contains("enum index -1 out of range 0..8"));
}

#[test]
fn union_branch_out_of_range_is_refused() {
    let mut bytes = encode(
        &ControlRecord::Trigger { requested_ms: 5 },
        &Framing::SingleObject,
    );
    assert_eq!(bytes[10], 4); // zigzag 2: Trigger
    bytes[10] = 8; // zigzag 4: no such branch
    assert_eq!(
        err::<ControlRecord>(&bytes),
        "malformed io.tocsin.ControlRecord at byte 10 (field body): union branch 4 out of range 0..4"
    );
}

#[test]
fn huge_length_prefix_is_refused_before_allocating() {
    // A RunEvent whose run_id claims 2^40 bytes.
    let mut bytes = single_object_header::<RunEvent>();
    write_long(1 << 40, &mut bytes);
    bytes.extend_from_slice(b"abc");
    assert_eq!(
        err::<RunEvent>(&bytes),
        "malformed io.tocsin.RunEvent at byte 10 (field run_id): string length 1099511627776 exceeds the 3 bytes left"
    );
    // Just below apache-avro's 512 MiB budget, which it would allocate (vec![0; len]) before
    // finding out that the input is 20 bytes long; we refuse it as well.
    let mut bytes = single_object_header::<RunEvent>();
    write_long(500 << 20, &mut bytes);
    assert!(err::<RunEvent>(&bytes).contains("string length 524288000 exceeds the 0 bytes left"));
    // An array count far beyond the input (TimerState.pending).
    let v = TimerState {
        definition: sample_job(),
        next_fire_ms: None,
        fires: 0,
        last_scheduled_ms: None,
        in_flight: None,
        buffered_ms: None,
        pending: vec![],
    };
    let mut bytes = encode(&v, &Framing::SingleObject);
    bytes.pop(); // the empty array's 0
    write_long(1 << 40, &mut bytes);
    assert!(err::<TimerState>(&bytes)
        .contains("(field pending): array length 1099511627776 exceeds the 0 bytes left"));
}

#[test]
fn apache_avro_refuses_huge_lengths_only_above_its_budget() {
    // What the reference reader does with the same 2^40 prefix: an allocation error, because
    // it is above its 512 MiB budget; anything below is allocated first (see binary.rs).
    let mut body = Vec::new();
    write_long(1 << 40, &mut body);
    let e = GenericDatumReader::builder(RunEvent::schema())
        .build()
        .unwrap()
        .read_value(&mut &body[..])
        .unwrap_err();
    assert!(e.to_string().to_lowercase().contains("alloc"), "{e}");
}

#[test]
fn varint_longer_than_ten_bytes_is_refused() {
    let mut bytes = single_object_header::<RunEvent>();
    bytes.extend_from_slice(&[0xFF; 11]);
    assert_eq!(
        err::<RunEvent>(&bytes),
        "malformed io.tocsin.RunEvent at byte 10 (field run_id): variable-length integer longer than 10 bytes"
    );
}

#[test]
fn invalid_utf8_and_booleans_are_refused() {
    let mut bytes = single_object_header::<RunEvent>();
    bytes.extend_from_slice(&[4, 0xFF, 0xFE]);
    assert_eq!(
        err::<RunEvent>(&bytes),
        "malformed io.tocsin.RunEvent at byte 11 (field run_id): string is not valid utf-8"
    );
    let mut r = Reader::new(&[2], 0);
    let e = r.value(&Shape::Boolean).unwrap_err();
    assert_eq!(
        e.problem.to_string(),
        "boolean byte 0x02 is neither 0 nor 1"
    );
}

#[test]
fn out_of_range_numbers_are_refused_naming_the_field() {
    let schema = RunEvent::schema();
    let mut value = sample_event().to_avro();
    let apache_avro::types::Value::Record(fields) = &mut value else {
        unreachable!()
    };
    fields[4].1 = apache_avro::types::Value::Long(-1);
    fields[9].1 =
        apache_avro::types::Value::Union(1, Box::new(apache_avro::types::Value::Long(-5)));
    let body = GenericDatumWriter::builder(schema)
        .build()
        .unwrap()
        .write_value_to_vec(value.clone())
        .unwrap();
    let mut bytes = single_object_header::<RunEvent>();
    bytes.extend_from_slice(&body);
    assert_eq!(
        err::<RunEvent>(&bytes),
        "invalid io.tocsin.RunEvent field attempt: -1 is out of range 0-4294967295"
    );
    let apache_avro::types::Value::Record(fields) = &mut value else {
        unreachable!()
    };
    fields[4].1 = apache_avro::types::Value::Long(1);
    assert_eq!(
        RunEvent::from_avro(value).unwrap_err().to_string(),
        "invalid io.tocsin.RunEvent field duration_ms: -5 is negative, must be >= 0"
    );
}

#[test]
fn unknown_enum_symbols_and_missing_fields_are_refused() {
    let mut value = sample_event().to_avro();
    let apache_avro::types::Value::Record(fields) = &mut value else {
        unreachable!()
    };
    fields[5].1 = apache_avro::types::Value::Enum(0, "exploded".into());
    assert_eq!(
        RunEvent::from_avro(value).unwrap_err().to_string(),
        "invalid io.tocsin.RunEvent field kind: unknown symbol \"exploded\" of io.tocsin.RunEventKind, expected one of fired, started, heartbeat, succeeded, failed, retrying, dead, skipped"
    );
    let mut value = sample_event().to_avro();
    let apache_avro::types::Value::Record(fields) = &mut value else {
        unreachable!()
    };
    fields.remove(7);
    assert_eq!(
        RunEvent::from_avro(value).unwrap_err().to_string(),
        "invalid io.tocsin.RunEvent field node: missing"
    );
}

#[test]
fn u64_above_i64_max_saturates() {
    let mut e = sample_event();
    e.duration_ms = Some(u64::MAX);
    let back: RunEvent = decode(&encode(&e, &Framing::SingleObject)).unwrap();
    assert_eq!(back.duration_ms, Some(i64::MAX as u64));
}

// ---------- schema evolution ----------

#[test]
fn data_of_an_earlier_schema_version_resolves_to_the_current_one() {
    // Pretend RunEvent v1 had no duration_ms and v2 added it with a default.
    let current = include_str!("../../schemas/RunEvent.avsc");
    let mut old: serde_json::Value = serde_json::from_str(current).unwrap();
    let fields = old["fields"].as_array_mut().unwrap();
    assert_eq!(fields.pop().unwrap()["name"], "duration_ms");
    let old = old.to_string();
    let compiled = CompiledSchema::new("io.tocsin.RunEvent", current, &[&old]);
    let old_schema = apache_avro::Schema::parse_str(&old).unwrap();

    let mut value = sample_event().to_avro();
    let apache_avro::types::Value::Record(fields) = &mut value else {
        unreachable!()
    };
    fields.pop();
    let mut bytes = vec![0xC3, 0x01];
    bytes.extend_from_slice(&old_schema.fingerprint::<apache_avro::rabin::Rabin>().bytes);
    binary::write_value(&value, &mut bytes);

    let back: RunEvent = decode_with(&compiled, &bytes).unwrap();
    assert_eq!(back, sample_event());
    // Without the history entry the same bytes are refused, naming both fingerprints.
    assert!(matches!(
        decode_with::<RunEvent>(&RUN_EVENT, &bytes),
        Err(CodecError::FingerprintMismatch { .. })
    ));
}

// ---------- schemas ----------

#[test]
fn every_embedded_schema_compiles_and_is_fingerprinted_by_the_specification() {
    for (file, _, compiled) in all() {
        assert_eq!(
            compiled.name(),
            format!("io.tocsin.{}", file.trim_end_matches(".avsc"))
        );
        // The form has no docs, defaults or logical types, and starts with the full name.
        let form = compiled.canonical_form();
        assert!(
            form.starts_with(&format!(
                "{{\"name\":\"{}\",\"type\":\"record\"",
                compiled.name()
            )),
            "{file}: {form}"
        );
        for stripped in ["doc", "default", "logicalType", "namespace", " ", "\n"] {
            assert!(!form.contains(stripped), "{file}: {stripped:?} in {form}");
        }
        assert_eq!(
            compiled.fingerprint(),
            canonical::crc64_avro(form.as_bytes()),
            "{file}"
        );
        // Every schema has an instant, so the two fingerprints differ.
        assert_ne!(
            compiled.fingerprint(),
            compiled.legacy_fingerprint(),
            "{file}"
        );
    }
}

/// What earlier builds wrote is what apache_avro 0.22 computes. (When an upgrade of the crate
/// fixes AVRO-4004, this fails: the legacy form stays as it is, and this test goes; the committed
/// fixtures of `tests/codec_fixtures.rs` keep checking the legacy fingerprints.)
#[test]
fn the_legacy_fingerprint_is_apache_avro_0_22s() {
    for (file, json, compiled) in all() {
        let json: serde_json::Value = serde_json::from_str(json).unwrap();
        let ours = canonical::canonical_form(&json, canonical::Form::ApacheAvro022).unwrap();
        assert_eq!(ours, compiled.schema().canonical_form(), "{file}");
        let theirs = compiled.schema().fingerprint::<apache_avro::rabin::Rabin>();
        assert_eq!(
            compiled.legacy_fingerprint().to_le_bytes().as_slice(),
            theirs.bytes.as_slice(),
            "{file}"
        );
        // Our CRC-64-AVRO over their form is their Rabin digest.
        assert_eq!(
            canonical::crc64_avro(compiled.schema().canonical_form().as_bytes()).to_le_bytes(),
            theirs.bytes.as_slice(),
            "{file}"
        );
    }
}

#[test]
fn single_object_data_with_either_fingerprint_decodes_and_the_new_one_is_written() {
    let e = sample_event();
    let bytes = encode(&e, &Framing::SingleObject);
    assert_eq!(bytes[..10], single_object_header::<RunEvent>()[..]);
    let mut legacy = vec![0xC3, 0x01];
    legacy.extend_from_slice(&RunEvent::compiled().legacy_fingerprint().to_le_bytes());
    legacy.extend_from_slice(&bytes[10..]);
    assert_eq!(decode::<RunEvent>(&bytes).unwrap(), e);
    assert_eq!(decode::<RunEvent>(&legacy).unwrap(), e);
}

/// Every named type, as JSON, per file.
fn named_types(json: &serde_json::Value, out: &mut BTreeMap<String, serde_json::Value>) {
    match json {
        serde_json::Value::Array(items) => items.iter().for_each(|i| named_types(i, out)),
        serde_json::Value::Object(o) => {
            if let (Some(name), Some(kind)) = (o.get("name"), o.get("type")) {
                if kind == "record" || kind == "enum" {
                    out.insert(name.as_str().unwrap().to_owned(), json.clone());
                }
            }
            o.values().for_each(|v| named_types(v, out));
        }
        _ => {}
    }
}

fn check_docs(file: &str, json: &serde_json::Value) {
    match json {
        serde_json::Value::Array(items) => items.iter().for_each(|i| check_docs(file, i)),
        serde_json::Value::Object(o) => {
            if matches!(
                o.get("type").and_then(|t| t.as_str()),
                Some("record" | "enum")
            ) {
                assert!(
                    o.contains_key("doc"),
                    "{file}: type {:?} has no doc",
                    o["name"]
                );
            }
            if let Some(fields) = o.get("fields").and_then(|f| f.as_array()) {
                for f in fields {
                    assert!(
                        f.get("doc")
                            .and_then(|d| d.as_str())
                            .is_some_and(|d| !d.is_empty()),
                        "{file}: field {:?} has no doc",
                        f["name"]
                    );
                }
            }
            o.values().for_each(|v| check_docs(file, v));
        }
        _ => {}
    }
}

#[test]
fn every_field_and_type_has_a_doc() {
    for (file, text, _) in all() {
        check_docs(file, &serde_json::from_str(text).unwrap());
    }
}

#[test]
fn a_named_type_is_the_same_in_every_file() {
    let mut seen: BTreeMap<String, (&str, serde_json::Value)> = BTreeMap::new();
    for (file, text, _) in all() {
        let mut types = BTreeMap::new();
        named_types(&serde_json::from_str(text).unwrap(), &mut types);
        for (name, mut def) in types {
            // The top-level namespace is inherited by nested types; compare without it.
            def.as_object_mut().unwrap().remove("namespace");
            match seen.get(&name) {
                Some((first, earlier)) => {
                    assert_eq!(earlier, &def, "{name} differs between {first} and {file}")
                }
                None => {
                    seen.insert(name, (file, def));
                }
            }
        }
    }
}

fn check_enum<E: AvroEnum>(schema: &apache_avro::Schema) {
    fn find<'a>(
        s: &'a apache_avro::Schema,
        name: &str,
    ) -> Option<&'a apache_avro::schema::EnumSchema> {
        use apache_avro::Schema as S;
        match s {
            S::Enum(e) if e.name.fullname(None) == name => Some(e),
            S::Record(r) => r.fields.iter().find_map(|f| find(&f.schema, name)),
            S::Union(u) => u.variants().iter().find_map(|v| find(v, name)),
            S::Array(a) => find(&a.items, name),
            S::Map(m) => find(&m.types, name),
            _ => None,
        }
    }
    let e = find(schema, E::NAME).unwrap_or_else(|| panic!("{} not in schema", E::NAME));
    assert_eq!(e.symbols, E::SYMBOLS, "{}", E::NAME);
    assert!(e.default.is_some(), "{} has no default symbol", E::NAME);
}

#[test]
fn rust_enums_match_their_avro_symbols() {
    check_enum::<DstGapPolicy>(JobDefinition::schema());
    check_enum::<DstRepeatPolicy>(JobDefinition::schema());
    check_enum::<MisfirePolicy>(JobDefinition::schema());
    check_enum::<OverlapPolicy>(JobDefinition::schema());
    check_enum::<HandlerKind>(JobDefinition::schema());
    check_enum::<FireReason>(TimerState::schema());
    check_enum::<FireReason>(Run::schema());
    check_enum::<Outcome>(ControlRecord::schema());
    check_enum::<RunEventKind>(RunEvent::schema());
    // Serde (JSON, TOML) and Avro spell the symbols alike.
    for v in RunEventKind::VARIANTS {
        let json = serde_json::to_string(v).unwrap();
        let apache_avro::types::Value::Enum(_, symbol) = v.to_avro() else {
            unreachable!()
        };
        assert_eq!(json, format!("{symbol:?}"));
    }
}

#[test]
fn schema_defaults_match_the_rust_defaults() {
    // A JobDefinition written by someone who set only the required fields reads as the Rust
    // defaults: resolve a record of the required fields against the schema.
    use apache_avro::types::Value;
    let minimal = Value::Record(vec![
        ("id".into(), Value::String("j".into())),
        ("tenant".into(), Value::String("t".into())),
        (
            "schedule".into(),
            Value::Union(
                2,
                Box::new(Value::Record(vec![(
                    "at_ms".into(),
                    Value::TimestampMillis(5),
                )])),
            ),
        ),
        (
            "handler".into(),
            Value::Record(vec![
                ("kind".into(), Value::Enum(0, "kafka".into())),
                ("target".into(), Value::String("out".into())),
            ]),
        ),
    ]);
    let resolved = minimal.resolve(JobDefinition::schema()).unwrap();
    let job = JobDefinition::from_avro(resolved).unwrap();
    let expected: JobDefinition = serde_json::from_str(
        r#"{"id":"j","tenant":"t","schedule":{"once":{"at_ms":5}},
            "handler":{"kind":"kafka","target":"out"}}"#,
    )
    .unwrap();
    assert_eq!(job, expected);
}

fn sample_job() -> JobDefinition {
    JobDefinition {
        id: "billing-7".into(),
        tenant: "acme".into(),
        schedule: ScheduleSpec::Cron {
            expr: "0 */5 * * * *".into(),
            zone: "Europe/Paris".into(),
        },
        start_ms: None,
        end_ms: None,
        max_fires: None,
        jitter_ms: 0,
        dst_gap: DstGapPolicy::Shift,
        dst_repeat: DstRepeatPolicy::Once,
        misfire: MisfirePolicy::FireOnce,
        catch_up_window_ms: 3_600_000,
        overlap: OverlapPolicy::Allow,
        paused: false,
        handler: HandlerSpec {
            kind: HandlerKind::Kafka,
            target: "out".into(),
            payload: b"{}".to_vec(),
            headers: BTreeMap::new(),
            method: None,
            args: vec![],
        },
        timeout_ms: 300_000,
        retry: RetryPolicy::default(),
        labels: BTreeMap::new(),
        revision: 1,
    }
}

#[test]
fn encode_into_appends() {
    let mut buf = vec![9];
    encode_into(&sample_job(), &Framing::SingleObject, &mut buf);
    assert_eq!(buf[0], 9);
    assert_eq!(
        &buf[1..],
        &encode(&sample_job(), &Framing::SingleObject)[..]
    );
}
