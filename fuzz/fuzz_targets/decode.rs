//! Arbitrary bytes into every record decoder: the Avro ones (`codec::decode`, both framings)
//! and the JSON and TOML job definitions of `tocsin jobs put --file`.
//!
//! None may panic. A record that decodes must also survive the way back: encoded again (which
//! in this build also checks the direct encoder against the reference one) it decodes to the
//! same record, and apache_avro's own reader, given the same body, reads the same record.

#![no_main]

use std::fmt::Debug;

use apache_avro::reader::datum::GenericDatumReader;
use libfuzzer_sys::fuzz_target;
use tocsin::codec::{decode, encode, AvroRecord, Framing};
use tocsin::model::job::JobDefinition;
use tocsin::model::records::{ControlRecord, DeadLetter, Run, RunEvent, TimerState};

fuzz_target!(|data: &[u8]| {
    avro::<JobDefinition>(data);
    avro::<TimerState>(data);
    avro::<Run>(data);
    avro::<RunEvent>(data);
    avro::<ControlRecord>(data);
    avro::<DeadLetter>(data);
    text(data);
});

fn avro<T: AvroRecord + PartialEq + Debug>(data: &[u8]) {
    let Ok(v) = decode::<T>(data) else {
        return;
    };
    for framing in [Framing::SingleObject, Framing::Confluent { schema_id: 7 }] {
        let bytes = encode(&v, &framing);
        let back = decode::<T>(&bytes)
            .unwrap_or_else(|e| panic!("{framing:?} re-encoding of {v:?} does not decode: {e}"));
        assert_eq!(back, v, "{framing:?} round trip");
        assert_eq!(
            encode(&back, &framing),
            bytes,
            "{framing:?} encoding is not stable"
        );
    }
    // The body of the current schema, read by the reference implementation. (Data of an earlier
    // schema version is resolved instead; the round trip above covers it.)
    let body = match data {
        [0x00, _, _, _, _, body @ ..] => body,
        [0xC3, 0x01, rest @ ..]
            if rest.len() >= 8
                && [T::compiled().fingerprint(), T::compiled().legacy_fingerprint()]
                    .contains(&u64::from_le_bytes(rest[..8].try_into().unwrap())) =>
        {
            &rest[8..]
        }
        _ => return,
    };
    let mut reader = body;
    let value = GenericDatumReader::builder(T::schema())
        .build()
        .expect("our schema")
        .read_value(&mut reader)
        .unwrap_or_else(|e| panic!("we decoded {v:?}, apache_avro fails: {e}"));
    assert!(reader.is_empty(), "apache_avro left {} bytes", reader.len());
    let reference = T::from_avro(value).unwrap_or_else(|e| {
        panic!("we decoded {v:?}, from_avro of apache_avro's value fails: {e}")
    });
    assert_eq!(reference, v, "apache_avro reads another record");
}

/// JSON and TOML definitions, as `jobs put --file` reads them. `jobs get` prints JSON, which must
/// read back as the same definition.
fn text(data: &[u8]) {
    if let Ok(def) = serde_json::from_slice::<JobDefinition>(data) {
        let json = serde_json::to_string_pretty(&def).expect("a definition serializes");
        let back: JobDefinition = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("JSON of {def:?} does not read back: {e}\n{json}"));
        assert_eq!(back, def, "JSON round trip");
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = toml::from_str::<JobDefinition>(text);
    }
}
