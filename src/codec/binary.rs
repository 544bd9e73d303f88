//! Avro binary encoding of [`Value`]s, without framing.
//!
//! Why not `apache_avro`'s own datum reader and writer: its reader allocates whatever a length
//! prefix asks for, up to a process-wide budget of 512 MiB (`vec![0; len]` for bytes and strings,
//! `reserve_exact` for arrays), so a 20-byte hostile record can make it allocate hundreds of MiB;
//! it also rebuilds the name table of the schema on each reader it builds, and writes maps in
//! `HashMap` order, so the same record does not always encode to the same bytes. Here every
//! length is checked against the bytes actually left before anything is allocated, maps are
//! written in key order, and the schema is compiled once into a [`Shape`]. `apache_avro` stays
//! the reference: the tests check that it reads what we write and that we read what it writes.

use std::collections::HashMap;

use apache_avro::schema::{Name, Schema};
use apache_avro::types::Value;

use super::Problem;

/// A schema compiled for reading: named references resolved, only the types we use.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Shape {
    Null,
    Boolean,
    Int,
    Long,
    TimestampMillis,
    Float,
    Double,
    Bytes,
    String,
    Fixed(usize),
    Array(Box<Shape>),
    Map(Box<Shape>),
    Union(Vec<Shape>),
    Record { fields: Vec<(String, Shape)> },
    Enum { name: String, symbols: Vec<String> },
}

impl Shape {
    /// Compiles a parsed schema. Recursive named types are not supported (ours have none).
    pub(crate) fn compile(schema: &Schema) -> Result<Shape, String> {
        let mut named = HashMap::new();
        compile(schema, None, &mut named)
    }
}

fn compile(
    schema: &Schema,
    namespace: Option<&str>,
    named: &mut HashMap<String, Shape>,
) -> Result<Shape, String> {
    Ok(match schema {
        Schema::Null => Shape::Null,
        Schema::Boolean => Shape::Boolean,
        Schema::Int => Shape::Int,
        Schema::Long => Shape::Long,
        Schema::TimestampMillis => Shape::TimestampMillis,
        Schema::Float => Shape::Float,
        Schema::Double => Shape::Double,
        Schema::Bytes => Shape::Bytes,
        Schema::String => Shape::String,
        Schema::Array(a) => Shape::Array(Box::new(compile(&a.items, namespace, named)?)),
        Schema::Map(m) => Shape::Map(Box::new(compile(&m.types, namespace, named)?)),
        Schema::Union(u) => Shape::Union(
            u.variants()
                .iter()
                .map(|v| compile(v, namespace, named))
                .collect::<Result<_, _>>()?,
        ),
        Schema::Record(r) => {
            let inner = r.name.namespace().or(namespace);
            let fields = r
                .fields
                .iter()
                .map(|f| Ok((f.name.clone(), compile(&f.schema, inner, named)?)))
                .collect::<Result<Vec<_>, String>>()?;
            let shape = Shape::Record { fields };
            named.insert(fullname(&r.name, namespace), shape.clone());
            shape
        }
        Schema::Enum(e) => {
            let name = fullname(&e.name, namespace);
            let shape = Shape::Enum {
                name: name.clone(),
                symbols: e.symbols.clone(),
            };
            named.insert(name, shape.clone());
            shape
        }
        Schema::Fixed(f) => {
            let shape = Shape::Fixed(f.size);
            named.insert(fullname(&f.name, namespace), shape.clone());
            shape
        }
        Schema::Ref { name } => {
            let full = fullname(name, namespace);
            named
                .get(&full)
                .cloned()
                .ok_or_else(|| format!("reference to {full} before its definition"))?
        }
        other => return Err(format!("unsupported schema type {other:?}")),
    })
}

fn fullname(name: &Name, namespace: Option<&str>) -> String {
    name.fullname(namespace)
}

/// Where and why a body failed to decode. `rev_path` holds field names innermost first.
#[derive(Debug)]
pub struct Fault {
    pub(crate) offset: usize,
    pub(crate) rev_path: Vec<String>,
    pub(crate) problem: Problem,
}

impl Fault {
    pub(crate) fn path(&self) -> String {
        let mut parts: Vec<&str> = self.rev_path.iter().map(String::as_str).collect();
        parts.reverse();
        parts.join(".")
    }
}

/// Reads one value of `shape` from `buf` starting at `*pos`; `base` is the offset of `buf[0]` in
/// the whole input, for messages.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], base: usize) -> Self {
        Reader { buf, pos: 0, base }
    }

    pub(crate) fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn offset(&self) -> usize {
        self.base + self.pos
    }

    fn fault(&self, at: usize, problem: Problem) -> Fault {
        Fault {
            offset: self.base + at,
            rev_path: Vec::new(),
            problem,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Fault> {
        if n > self.left() {
            return Err(self.fault(
                self.pos,
                Problem::Truncated {
                    needed: n,
                    left: self.left(),
                },
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(crate) fn long(&mut self) -> Result<i64, Fault> {
        let start = self.pos;
        let mut acc: u64 = 0;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.fault(self.pos, Problem::Truncated { needed: 1, left: 0 }));
            };
            self.pos += 1;
            acc |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(((acc >> 1) as i64) ^ -((acc & 1) as i64));
            }
        }
        Err(self.fault(start, Problem::VarintTooLong))
    }

    /// A length of `what`, bounded by the bytes left: every item of our schemas takes at least
    /// one byte, so a larger count cannot be honest and is refused before any allocation.
    fn length(&mut self, what: &'static str) -> Result<usize, Fault> {
        let at = self.pos;
        let len = self.long()?;
        if len < 0 {
            return Err(self.fault(at, Problem::NegativeLength { what, len }));
        }
        let left = self.left();
        match usize::try_from(len) {
            Ok(n) if n <= left => Ok(n),
            _ => Err(self.fault(
                at,
                Problem::LengthTooLarge {
                    what,
                    len: len as u64,
                    left,
                },
            )),
        }
    }

    /// The item count of the next block of an array or map; 0 ends it. A negative count is
    /// followed by the block's size in bytes, which we check and otherwise ignore.
    fn block(&mut self, what: &'static str) -> Result<usize, Fault> {
        let at = self.pos;
        let count = self.long()?;
        if count >= 0 {
            let left = self.left();
            return match usize::try_from(count) {
                Ok(n) if n <= left => Ok(n),
                _ => Err(self.fault(
                    at,
                    Problem::LengthTooLarge {
                        what,
                        len: count as u64,
                        left,
                    },
                )),
            };
        }
        let Some(count) = count.checked_neg() else {
            return Err(self.fault(at, Problem::NegativeLength { what, len: count }));
        };
        self.length("block")?;
        let left = self.left();
        match usize::try_from(count) {
            Ok(n) if n <= left => Ok(n),
            _ => Err(self.fault(
                at,
                Problem::LengthTooLarge {
                    what,
                    len: count as u64,
                    left,
                },
            )),
        }
    }

    pub(crate) fn string(&mut self) -> Result<String, Fault> {
        let len = self.length("string")?;
        let at = self.pos;
        let bytes = self.take(len)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(self.fault(at, Problem::InvalidUtf8)),
        }
    }

    // ---- typed reads, for the direct codecs (records.rs) ----

    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>, Fault> {
        let len = self.length("bytes")?;
        Ok(self.take(len)?.to_vec())
    }

    pub(crate) fn boolean(&mut self) -> Result<bool, Fault> {
        let at = self.pos;
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(self.fault(at, Problem::InvalidBoolean { byte })),
        }
    }

    /// A branch or symbol index below `count`.
    pub(crate) fn index(&mut self, count: usize) -> Result<usize, Fault> {
        let at = self.pos;
        let index = self.long()?;
        match usize::try_from(index) {
            Ok(i) if i < count => Ok(i),
            _ => Err(self.fault(at, Problem::UnionIndex { index, count })),
        }
    }

    /// A value that must fit `T` (the unsigned Rust integers).
    pub(crate) fn ranged<T: TryFrom<i64>>(&mut self) -> Result<T, Fault> {
        let at = self.pos;
        let value = self.long()?;
        T::try_from(value).map_err(|_| self.fault(at, Problem::IntOutOfRange { value }))
    }

    /// `["null", T]`.
    pub(crate) fn optional<T>(
        &mut self,
        read: impl FnOnce(&mut Self) -> Result<T, Fault>,
    ) -> Result<Option<T>, Fault> {
        match self.index(2)? {
            0 => Ok(None),
            _ => read(self).map(Some),
        }
    }

    /// An array (or, with `key`, a map) in blocks.
    pub(crate) fn blocks(
        &mut self,
        what: &'static str,
        mut item: impl FnMut(&mut Self) -> Result<(), Fault>,
    ) -> Result<(), Fault> {
        loop {
            let n = self.block(what)?;
            if n == 0 {
                return Ok(());
            }
            for _ in 0..n {
                item(self)?;
            }
        }
    }

    pub(crate) fn value(&mut self, shape: &Shape) -> Result<Value, Fault> {
        Ok(match shape {
            Shape::Null => Value::Null,
            Shape::Boolean => {
                let at = self.pos;
                match self.take(1)?[0] {
                    0 => Value::Boolean(false),
                    1 => Value::Boolean(true),
                    byte => return Err(self.fault(at, Problem::InvalidBoolean { byte })),
                }
            }
            Shape::Int => {
                let at = self.pos;
                let v = self.long()?;
                match i32::try_from(v) {
                    Ok(i) => Value::Int(i),
                    Err(_) => return Err(self.fault(at, Problem::IntOutOfRange { value: v })),
                }
            }
            Shape::Long => Value::Long(self.long()?),
            Shape::TimestampMillis => Value::TimestampMillis(self.long()?),
            Shape::Float => {
                let b = self.take(4)?;
                Value::Float(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            Shape::Double => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Value::Double(f64::from_le_bytes(a))
            }
            Shape::Bytes => {
                let len = self.length("bytes")?;
                Value::Bytes(self.take(len)?.to_vec())
            }
            Shape::String => Value::String(self.string()?),
            Shape::Fixed(size) => Value::Fixed(*size, self.take(*size)?.to_vec()),
            Shape::Array(items) => {
                let mut out = Vec::new();
                loop {
                    let n = self.block("array")?;
                    if n == 0 {
                        break;
                    }
                    out.reserve(n);
                    for _ in 0..n {
                        let i = out.len();
                        out.push(self.value(items).map_err(|mut f| {
                            f.rev_path.push(format!("[{i}]"));
                            f
                        })?);
                    }
                }
                Value::Array(out)
            }
            Shape::Map(values) => {
                let mut out = HashMap::new();
                loop {
                    let n = self.block("map")?;
                    if n == 0 {
                        break;
                    }
                    out.reserve(n);
                    for _ in 0..n {
                        let key = self.string()?;
                        let v = self.value(values).map_err(|mut f| {
                            f.rev_path.push(format!("[{key:?}]"));
                            f
                        })?;
                        out.insert(key, v);
                    }
                }
                Value::Map(out)
            }
            Shape::Union(branches) => {
                let at = self.pos;
                let index = self.long()?;
                let Some(branch) = usize::try_from(index).ok().and_then(|i| branches.get(i)) else {
                    return Err(self.fault(
                        at,
                        Problem::UnionIndex {
                            index,
                            count: branches.len(),
                        },
                    ));
                };
                Value::Union(index as u32, Box::new(self.value(branch)?))
            }
            Shape::Record { fields } => {
                let mut out = Vec::with_capacity(fields.len());
                for (name, shape) in fields {
                    let v = self.value(shape).map_err(|mut f| {
                        f.rev_path.push(name.clone());
                        f
                    })?;
                    out.push((name.clone(), v));
                }
                Value::Record(out)
            }
            Shape::Enum { name, symbols } => {
                let at = self.pos;
                let index = self.long()?;
                let Some(symbol) = usize::try_from(index).ok().and_then(|i| symbols.get(i)) else {
                    return Err(self.fault(
                        at,
                        Problem::EnumIndex {
                            name: name.clone(),
                            index,
                            count: symbols.len(),
                        },
                    ));
                };
                Value::Enum(index as u32, symbol.clone())
            }
        })
    }
}

/// Appends the Avro binary encoding of `v`. The value carries everything the encoding needs
/// (record fields in schema order, union branch indexes, enum indexes); that our `to_avro`
/// values match their schemas is checked in debug builds and by the property tests.
pub(crate) fn write_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => {}
        Value::Boolean(b) => out.push(u8::from(*b)),
        Value::Int(i) | Value::Date(i) | Value::TimeMillis(i) => write_long(i64::from(*i), out),
        Value::Long(i)
        | Value::TimestampMillis(i)
        | Value::TimestampMicros(i)
        | Value::TimestampNanos(i)
        | Value::LocalTimestampMillis(i)
        | Value::LocalTimestampMicros(i)
        | Value::LocalTimestampNanos(i)
        | Value::TimeMicros(i) => write_long(*i, out),
        Value::Float(f) => out.extend_from_slice(&f.to_le_bytes()),
        Value::Double(f) => out.extend_from_slice(&f.to_le_bytes()),
        Value::Bytes(b) => write_bytes(b, out),
        Value::String(s) => write_bytes(s.as_bytes(), out),
        Value::Fixed(_, b) => out.extend_from_slice(b),
        Value::Enum(i, _) => write_long(i64::from(*i), out),
        Value::Union(i, v) => {
            write_long(i64::from(*i), out);
            write_value(v, out);
        }
        Value::Array(items) => {
            if !items.is_empty() {
                write_long(items.len() as i64, out);
                for item in items {
                    write_value(item, out);
                }
            }
            out.push(0);
        }
        Value::Map(entries) => {
            if !entries.is_empty() {
                write_long(entries.len() as i64, out);
                // Key order, so that equal records encode to equal bytes.
                let mut keys: Vec<&String> = entries.keys().collect();
                keys.sort_unstable();
                for k in keys {
                    write_bytes(k.as_bytes(), out);
                    write_value(&entries[k], out);
                }
            }
            out.push(0);
        }
        Value::Record(fields) => {
            for (_, v) in fields {
                write_value(v, out);
            }
        }
        // Our records use none of these logical types.
        other => unreachable!("avro value {other:?} is not used by tocsin schemas"),
    }
}

pub(crate) fn write_long(n: i64, out: &mut Vec<u8>) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z > 0x7f {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

pub(crate) fn write_bytes(b: &[u8], out: &mut Vec<u8>) {
    write_long(b.len() as i64, out);
    out.extend_from_slice(b);
}
