//! Helpers for the hand-written conversions between records and [`Value`]s.
//!
//! Unsigned Rust integers travel as Avro `long` (Avro has no unsigned types, and `int` cannot
//! hold every `u32`). Writing saturates a `u64` above `i64::MAX` (no real count or duration gets
//! there); reading refuses a negative value, or a value too large for the Rust type, naming the
//! field.

use std::collections::{BTreeMap, HashMap};

use apache_avro::types::Value;

use super::CodecError;

/// Builds a record value from fields in schema order.
pub(crate) fn record<const N: usize>(fields: [(&str, Value); N]) -> Value {
    let mut out = Vec::with_capacity(N);
    for (k, v) in fields {
        out.push((k.to_owned(), v));
    }
    Value::Record(out)
}

pub(crate) fn string(s: &str) -> Value {
    Value::String(s.to_owned())
}

pub(crate) fn long(n: i64) -> Value {
    Value::Long(n)
}

pub(crate) fn unsigned(n: u64) -> Value {
    Value::Long(i64::try_from(n).unwrap_or(i64::MAX))
}

pub(crate) fn instant(ms: i64) -> Value {
    Value::TimestampMillis(ms)
}

/// `["null", T]`: branch 0 is null.
pub(crate) fn optional(v: Option<Value>) -> Value {
    match v {
        None => Value::Union(0, Box::new(Value::Null)),
        Some(v) => Value::Union(1, Box::new(v)),
    }
}

pub(crate) fn string_map(m: &BTreeMap<String, String>) -> Value {
    Value::Map(
        m.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect::<HashMap<_, _>>(),
    )
}

/// A Rust enum that is an Avro enum whose symbols are `SYMBOLS`, in order.
pub(crate) trait AvroEnum: Sized + Copy + PartialEq + 'static {
    const NAME: &'static str;
    const SYMBOLS: &'static [&'static str];
    const VARIANTS: &'static [Self];

    fn to_avro(self) -> Value;

    /// Its symbol: the name schemas, job definitions and headers spell it with.
    fn symbol(self) -> &'static str {
        let i = Self::VARIANTS.iter().position(|&v| v == self);
        Self::SYMBOLS[i.unwrap_or_default()]
    }

    fn from_symbol(s: &str) -> Option<Self> {
        Self::SYMBOLS
            .iter()
            .position(|&x| x == s)
            .map(|i| Self::VARIANTS[i])
    }
}

/// Implements [`AvroEnum`]: `avro_enum!(Type, "io.tocsin.Name", [Variant => "symbol", ...])`.
macro_rules! avro_enum {
    ($ty:ty, $name:literal, [$($variant:ident => $symbol:literal),+ $(,)?]) => {
        impl $crate::codec::convert::AvroEnum for $ty {
            const NAME: &'static str = $name;
            const SYMBOLS: &'static [&'static str] = &[$($symbol),+];
            const VARIANTS: &'static [Self] = &[$(<$ty>::$variant),+];

            fn to_avro(self) -> apache_avro::types::Value {
                let i = Self::VARIANTS
                    .iter()
                    .position(|&v| v == self)
                    .unwrap_or_default();
                apache_avro::types::Value::Enum(i as u32, Self::SYMBOLS[i].to_owned())
            }
        }
    };
}
pub(crate) use avro_enum;

/// The fields of one record value, taken by name.
pub(crate) struct Fields {
    record: &'static str,
    fields: Vec<(String, Value)>,
    next: usize,
}

impl Fields {
    pub(crate) fn new(record: &'static str, v: Value) -> Result<Self, CodecError> {
        match v {
            Value::Record(fields) => Ok(Fields {
                record,
                fields,
                next: 0,
            }),
            other => Err(CodecError::InvalidField {
                record,
                field: "(record)",
                problem: format!("expected a record, found {}", kind(&other)),
            }),
        }
    }

    fn error(&self, field: &'static str, problem: String) -> CodecError {
        CodecError::InvalidField {
            record: self.record,
            field,
            problem,
        }
    }

    /// Takes a field's value. Fields usually come in schema order, so the next one is tried first.
    pub(crate) fn take(&mut self, field: &'static str) -> Result<Value, CodecError> {
        let at = match self.fields.get(self.next) {
            Some((name, _)) if name == field => self.next,
            _ => match self.fields.iter().position(|(name, _)| name == field) {
                Some(i) => i,
                None => return Err(self.error(field, "missing".to_owned())),
            },
        };
        self.next = at + 1;
        Ok(std::mem::replace(&mut self.fields[at].1, Value::Null))
    }

    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, CodecError> {
        let v = self.take(field)?;
        self.as_string(field, v)
    }

    fn as_string(&self, field: &'static str, v: Value) -> Result<String, CodecError> {
        match v {
            Value::String(s) => Ok(s),
            other => Err(self.error(field, format!("expected a string, found {}", kind(&other)))),
        }
    }

    pub(crate) fn bytes(&mut self, field: &'static str) -> Result<Vec<u8>, CodecError> {
        match self.take(field)? {
            Value::Bytes(b) => Ok(b),
            Value::String(s) => Ok(s.into_bytes()),
            other => Err(self.error(field, format!("expected bytes, found {}", kind(&other)))),
        }
    }

    pub(crate) fn boolean(&mut self, field: &'static str) -> Result<bool, CodecError> {
        match self.take(field)? {
            Value::Boolean(b) => Ok(b),
            other => Err(self.error(field, format!("expected a boolean, found {}", kind(&other)))),
        }
    }

    /// A `long` (or `int`, or `timestamp-millis`).
    pub(crate) fn long(&mut self, field: &'static str) -> Result<i64, CodecError> {
        let v = self.take(field)?;
        self.as_long(field, v)
    }

    fn as_long(&self, field: &'static str, v: Value) -> Result<i64, CodecError> {
        match v {
            Value::Long(n) | Value::TimestampMillis(n) => Ok(n),
            Value::Int(n) => Ok(i64::from(n)),
            other => Err(self.error(field, format!("expected a long, found {}", kind(&other)))),
        }
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, CodecError> {
        let n = self.long(field)?;
        self.to_u64(field, n)
    }

    fn to_u64(&self, field: &'static str, n: i64) -> Result<u64, CodecError> {
        u64::try_from(n).map_err(|_| self.error(field, format!("{n} is negative, must be >= 0")))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, CodecError> {
        let n = self.long(field)?;
        u32::try_from(n)
            .map_err(|_| self.error(field, format!("{n} is out of range 0-{}", u32::MAX)))
    }

    /// The value of a `["null", T]` field, `None` for null.
    pub(crate) fn optional(&mut self, field: &'static str) -> Result<Option<Value>, CodecError> {
        Ok(match self.take(field)? {
            Value::Union(_, v) => match *v {
                Value::Null => None,
                v => Some(v),
            },
            Value::Null => None,
            v => Some(v),
        })
    }

    pub(crate) fn opt_long(&mut self, field: &'static str) -> Result<Option<i64>, CodecError> {
        match self.optional(field)? {
            None => Ok(None),
            Some(v) => self.as_long(field, v).map(Some),
        }
    }

    pub(crate) fn opt_u64(&mut self, field: &'static str) -> Result<Option<u64>, CodecError> {
        match self.opt_long(field)? {
            None => Ok(None),
            Some(n) => self.to_u64(field, n).map(Some),
        }
    }

    pub(crate) fn opt_string(&mut self, field: &'static str) -> Result<Option<String>, CodecError> {
        match self.optional(field)? {
            None => Ok(None),
            Some(v) => self.as_string(field, v).map(Some),
        }
    }

    pub(crate) fn enumeration<E: AvroEnum>(
        &mut self,
        field: &'static str,
    ) -> Result<E, CodecError> {
        let symbol = match self.take(field)? {
            Value::Enum(_, s) | Value::String(s) => s,
            other => {
                return Err(self.error(field, format!("expected an enum, found {}", kind(&other))))
            }
        };
        E::from_symbol(&symbol).ok_or_else(|| {
            self.error(
                field,
                format!(
                    "unknown symbol {symbol:?} of {}, expected one of {}",
                    E::NAME,
                    E::SYMBOLS.join(", ")
                ),
            )
        })
    }

    pub(crate) fn string_map(
        &mut self,
        field: &'static str,
    ) -> Result<BTreeMap<String, String>, CodecError> {
        match self.take(field)? {
            Value::Map(m) => m
                .into_iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k, s)),
                    other => Err(self.error(
                        field,
                        format!(
                            "expected string values, found {} at key {k:?}",
                            kind(&other)
                        ),
                    )),
                })
                .collect(),
            other => Err(self.error(field, format!("expected a map, found {}", kind(&other)))),
        }
    }

    pub(crate) fn array(&mut self, field: &'static str) -> Result<Vec<Value>, CodecError> {
        match self.take(field)? {
            Value::Array(items) => Ok(items),
            other => Err(self.error(field, format!("expected an array, found {}", kind(&other)))),
        }
    }

    pub(crate) fn string_array(&mut self, field: &'static str) -> Result<Vec<String>, CodecError> {
        self.array(field)?
            .into_iter()
            .map(|v| self.as_string(field, v))
            .collect()
    }

    /// A union of records: the branch index and the record.
    pub(crate) fn union(&mut self, field: &'static str) -> Result<(u32, Value), CodecError> {
        match self.take(field)? {
            Value::Union(i, v) => Ok((i, *v)),
            other => Err(self.error(field, format!("expected a union, found {}", kind(&other)))),
        }
    }

    pub(crate) fn bad_branch(&self, field: &'static str, index: u32) -> CodecError {
        self.error(field, format!("unknown union branch {index}"))
    }
}

/// A short name of a value's type, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Boolean(_) => "a boolean",
        Value::Int(_) => "an int",
        Value::Long(_) => "a long",
        Value::Float(_) => "a float",
        Value::Double(_) => "a double",
        Value::Bytes(_) => "bytes",
        Value::String(_) => "a string",
        Value::Fixed(..) => "a fixed",
        Value::Enum(..) => "an enum",
        Value::Union(..) => "a union",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        Value::Record(_) => "a record",
        Value::TimestampMillis(_) => "a timestamp-millis",
        _ => "a logical type",
    }
}
