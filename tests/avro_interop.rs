//! Stock Avro libraries and Tocsin read each other's single-object records, for every schema in
//! `schemas/`: Apache Avro for Java, through its own `BinaryMessageEncoder` and
//! `BinaryMessageDecoder` (`tests/java/AvroInterop.java`), and Python's fastavro
//! (`tests/python/avro_interop.py`). `scripts/avro-clients` installs both, from Maven Central and
//! PyPI (`tests/python/requirements.txt`), when they are missing; `.ci/run` prepares them first.
//!
//! Each schema has datums in Avro's JSON encoding, one a line, in
//! `tests/fixtures/interop/<Name>.jsonl`, standing for the Tocsin values of `samples/` in the
//! same order. For each library:
//!
//! - it agrees with Tocsin on each schema's Parsing Canonical Form and fingerprint;
//! - it encodes each JSON datum, and Tocsin decodes the bytes to the sample value;
//! - Tocsin encodes each sample, and the library decodes the bytes (its decoder refuses a
//!   fingerprint it does not know) to the JSON datum.

mod common;
mod samples;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{answer_lines, repo_root, text};
use samples::*;
use tocsin::codec::{decode, encode, AvroRecord, Framing};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or_else(|e| panic!("{s:?}: {e}")))
        .collect()
}

/// Whether bytes decode to a case's sample, and if not, why.
type Check = Box<dyn Fn(&[u8]) -> Result<(), String>>;

/// One sample: its schema, Tocsin's single-object encoding of it, and a check that bytes decode
/// to it.
struct Case {
    schema: &'static str,
    label: String,
    ours: Vec<u8>,
    fingerprint: u64,
    canonical_form: &'static str,
    decodes_to_sample: Check,
}

fn case<T: AvroRecord + PartialEq + Debug + 'static>(
    schema: &'static str,
    label: &str,
    value: T,
) -> Case {
    let ours = encode(&value, &Framing::SingleObject);
    Case {
        schema,
        label: format!("{schema} {label}"),
        ours,
        fingerprint: T::compiled().fingerprint(),
        canonical_form: T::compiled().canonical_form(),
        decodes_to_sample: Box::new(move |bytes| match decode::<T>(bytes) {
            Ok(v) if v == value => Ok(()),
            Ok(v) => Err(format!("decoded {v:?}, want {value:?}")),
            Err(e) => Err(format!("does not decode: {e}")),
        }),
    }
}

/// Every sample, grouped by schema in the order of its `.jsonl` file.
fn cases() -> Vec<Case> {
    let mut out = vec![
        case("JobDefinition", "cron", sample_job()),
        case("JobDefinition", "once", sample_once_job()),
        case("JobDefinition", "interval", sample_timer().definition),
        case("TimerState", "interval", sample_timer()),
        case("Run", "kafka", sample_run()),
        case("RunEvent", "failed", sample_event()),
        case("RunEvent", "fired", sample_fired_event()),
        case("DeadLetter", "dead", sample_dead()),
    ];
    for (name, c) in sample_controls() {
        out.push(case("ControlRecord", name, c));
    }
    out
}

fn schema_path(schema: &str) -> PathBuf {
    repo_root().join("schemas").join(format!("{schema}.avsc"))
}

/// The JSON datums of `schema`, one a line.
fn datums(schema: &str) -> Vec<String> {
    let path = repo_root()
        .join("tests/fixtures/interop")
        .join(format!("{schema}.jsonl"));
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines().map(str::to_owned).collect()
}

/// Each case with its JSON datum.
fn cases_with_datums() -> Vec<(Case, String)> {
    let schemas: BTreeSet<&str> = cases().iter().map(|c| c.schema).collect();
    let in_dir: BTreeSet<String> = std::fs::read_dir(repo_root().join("schemas"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|f| f.strip_suffix(".avsc").map(str::to_owned))
        .collect();
    assert_eq!(
        in_dir,
        schemas.iter().map(|s| s.to_string()).collect(),
        "every schema in schemas/ has samples here, and only those"
    );
    let mut out = Vec::new();
    for schema in schemas {
        let of_schema: Vec<Case> = cases().into_iter().filter(|c| c.schema == schema).collect();
        let datums = datums(schema);
        assert_eq!(
            datums.len(),
            of_schema.len(),
            "{schema}.jsonl has one datum per sample"
        );
        out.extend(of_schema.into_iter().zip(datums));
    }
    out
}

/// A stock library's side of the test: a process that answers one line per request line.
enum Client {
    Java,
    Python,
}

impl Client {
    fn command(&self) -> Command {
        match self {
            Client::Java => {
                let out = Command::new(repo_root().join("scripts/avro-clients"))
                    .arg("classpath")
                    .output()
                    .expect("could not run scripts/avro-clients classpath");
                assert!(out.status.success(), "{}", text(&out.stderr));
                let mut c = Command::new("java");
                c.arg("-cp")
                    .arg(text(&out.stdout).trim())
                    .arg(repo_root().join("tests/java/AvroInterop.java"));
                c
            }
            Client::Python => {
                let mut c = Command::new(repo_root().join("scripts/avro-clients"));
                c.arg("python")
                    .arg(repo_root().join("tests/python/avro_interop.py"));
                c
            }
        }
    }

    /// The answers to `requests` (command, schema file, argument), in order.
    fn ask(&self, requests: &[(&str, &Path, &str)]) -> Vec<String> {
        let lines: Vec<String> = requests
            .iter()
            .map(|(command, schema, argument)| {
                format!("{command}\t{}\t{argument}", schema.display())
            })
            .collect();
        let answers = answer_lines(self.command(), &lines);
        assert_eq!(answers.len(), requests.len(), "one answer per request");
        answers
    }
}

fn interoperates(client: Client) {
    let cases = cases_with_datums();
    let paths: Vec<PathBuf> = cases.iter().map(|(c, _)| schema_path(c.schema)).collect();
    let ours_hex: Vec<String> = cases.iter().map(|(c, _)| hex(&c.ours)).collect();
    let mut requests = Vec::new();
    for (i, (_, datum)) in cases.iter().enumerate() {
        requests.push(("canonical", paths[i].as_path(), ""));
        requests.push(("encode", paths[i].as_path(), datum.as_str()));
        requests.push(("decode", paths[i].as_path(), ours_hex[i].as_str()));
    }
    let answers = client.ask(&requests);

    let mut failures = Vec::new();
    for (i, (case, datum)) in cases.iter().enumerate() {
        let [canonical, theirs, read] = &answers[3 * i..3 * i + 3] else {
            unreachable!()
        };
        let label = &case.label;

        let (form, fingerprint) = canonical.split_once('\t').unwrap_or((canonical, ""));
        if form != case.canonical_form {
            failures.push(format!(
                "{label}: canonical form\n  theirs {form}\n  ours   {}",
                case.canonical_form
            ));
        }
        if u64::from_str_radix(fingerprint, 16).ok() != Some(case.fingerprint) {
            failures.push(format!(
                "{label}: fingerprint theirs {fingerprint}, ours {:x}",
                case.fingerprint
            ));
        }

        // Theirs, read by Tocsin.
        if theirs.starts_with("error") {
            failures.push(format!("{label}: their encoder failed: {theirs}"));
        } else {
            let bytes = unhex(theirs);
            let mut header = vec![0xC3, 0x01];
            header.extend_from_slice(&case.fingerprint.to_le_bytes());
            if bytes.len() < 10 || bytes[..10] != header[..] {
                failures.push(format!(
                    "{label}: their header {}, ours {}",
                    hex(&bytes[..bytes.len().min(10)]),
                    hex(&header)
                ));
            }
            if let Err(e) = (case.decodes_to_sample)(&bytes) {
                failures.push(format!("{label}: their record {e}"));
            }
        }

        // Ours, read by them.
        let want: serde_json::Value = serde_json::from_str(datum)
            .unwrap_or_else(|e| panic!("{label}: datum is not json: {e}"));
        match serde_json::from_str::<serde_json::Value>(read) {
            Ok(got) if got == want => {}
            _ => failures.push(format!(
                "{label}: our record, read by them\n  got  {read}\n  want {datum}"
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn apache_avro_for_java_and_tocsin_read_each_others_records() {
    interoperates(Client::Java);
}

#[test]
fn fastavro_and_tocsin_read_each_others_records() {
    interoperates(Client::Python);
}

/// Data written by builds before Tocsin computed the specification's fingerprint carries
/// apache_avro 0.22's; Java's decoder does not know it (so such data is not interoperable), and
/// Tocsin still reads it. (`tests/codec_fixtures.rs` reads the committed records of that build.)
#[test]
fn the_legacy_fingerprint_is_read_by_tocsin_and_refused_by_java() {
    let sample = sample_event();
    let ours = encode(&sample, &Framing::SingleObject);
    let compiled = <tocsin::model::records::RunEvent as AvroRecord>::compiled();
    let mut legacy = vec![0xC3, 0x01];
    legacy.extend_from_slice(&compiled.legacy_fingerprint().to_le_bytes());
    legacy.extend_from_slice(&ours[10..]);
    assert_eq!(
        decode::<tocsin::model::records::RunEvent>(&legacy).unwrap(),
        sample
    );

    let path = schema_path("RunEvent");
    let answers = Client::Java.ask(&[("decode", &path, &hex(&legacy))]);
    assert!(
        answers[0].starts_with("error: org.apache.avro.message.MissingSchemaException"),
        "{}",
        answers[0]
    );
}
