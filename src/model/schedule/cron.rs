//! Our own cron parser and matcher over local wall-clock date-times.
//!
//! It never touches a time zone: it answers "which local date-times match", and `zone.rs` decides
//! which instants those are. That split is why we do not use a cron crate: the DST semantics must
//! be ours.

use std::fmt;

use chrono::{Datelike, NaiveDate, NaiveDateTime, NaiveTime, Timelike};

/// The first year a cron expression can match.
pub const MIN_YEAR: i32 = 1970;
/// The last year a cron expression can match; the search gives up after it. This is the
/// horizon of the time-zone data (chrono-tz's transition tables end with 2099: past it every
/// zone would keep its last offset, and a summer instant in New York would be an hour off), so
/// an instant after it is refused rather than computed wrongly.
pub const MAX_YEAR: i32 = 2099;

const YEAR_SPAN: usize = (MAX_YEAR - MIN_YEAR + 1) as usize;
const YEAR_WORDS: usize = YEAR_SPAN.div_ceil(64);

const MONTH_NAMES: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// The field of a cron expression an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Second,
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
    Year,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Second => "second",
            Field::Minute => "minute",
            Field::Hour => "hour",
            Field::DayOfMonth => "day-of-month",
            Field::Month => "month",
            Field::DayOfWeek => "day-of-week",
            Field::Year => "year",
        })
    }
}

impl Field {
    fn bounds(self) -> (u32, u32) {
        match self {
            Field::Second | Field::Minute => (0, 59),
            Field::Hour => (0, 23),
            Field::DayOfMonth => (1, 31),
            Field::Month => (1, 12),
            // 7 is accepted as a second name for Sunday and folded to 0 after parsing.
            Field::DayOfWeek => (0, 7),
            Field::Year => (MIN_YEAR as u32, MAX_YEAR as u32),
        }
    }
}

/// Why a cron expression was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error("expected 5, 6 or 7 fields, found {found}")]
    FieldCount { found: usize },
    #[error("{field} {value} out of range {min}-{max}")]
    OutOfRange {
        field: Field,
        value: u64,
        min: u32,
        max: u32,
    },
    #[error("unknown {field} name {name:?}")]
    UnknownName { field: Field, name: String },
    #[error("invalid {field} value {text:?}")]
    Invalid { field: Field, text: String },
    #[error("{field} step 0 is not allowed")]
    ZeroStep { field: Field },
    #[error("{field} step {step} out of range 1-{max}: a step may not exceed the field's width")]
    StepTooLarge { field: Field, step: u64, max: u32 },
    #[error("{field} range {start}-{end} is reversed: the start must not exceed the end")]
    ReversedRange { field: Field, start: u32, end: u32 },
    #[error("{field} does not allow {token:?}")]
    NotAllowed { field: Field, token: String },
    #[error("week-of-month {k} in {item:?} out of range 1-5")]
    NthOutOfRange { item: String, k: u64 },
    #[error("empty item in {field} list")]
    EmptyItem { field: Field },
}

/// A set of years, MIN_YEAR..=MAX_YEAR.
#[derive(Debug, Clone, PartialEq, Eq)]
struct YearSet([u64; YEAR_WORDS]);

impl YearSet {
    fn all() -> Self {
        let mut set = YearSet([0; YEAR_WORDS]);
        for y in MIN_YEAR..=MAX_YEAR {
            set.insert(y);
        }
        set
    }

    fn insert(&mut self, year: i32) {
        let i = (year - MIN_YEAR) as usize;
        self.0[i / 64] |= 1 << (i % 64);
    }

    fn contains(&self, year: i32) -> bool {
        if !(MIN_YEAR..=MAX_YEAR).contains(&year) {
            return false;
        }
        let i = (year - MIN_YEAR) as usize;
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
}

/// A parsed cron expression. Seconds are 0 for 5-field expressions; years are all of
/// MIN_YEAR..=MAX_YEAR unless a 7th field restricts them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronExpr {
    source: String,
    seconds: u64,
    minutes: u64,
    hours: u64,
    months: u64,
    years: YearSet,
    /// Plain days of the month, bits 1..=31.
    dom_days: u64,
    /// `L-n`: bit n set means "n days before the last day" (`L` is n = 0).
    dom_last_minus: u64,
    /// `LW`: the last weekday (Mon-Fri) of the month.
    dom_last_weekday: bool,
    /// `nW`: bit n set means "the weekday nearest to day n, within the month".
    dom_nearest_weekday: u64,
    /// Plain days of the week, bits 0..=6, 0 = Sunday.
    dow_days: u64,
    /// `nL`: bit n set means "the last such weekday of the month".
    dow_last: u64,
    /// `n#k`: `dow_nth[n]` bit k set means "the k-th such weekday of the month".
    dow_nth: [u8; 7],
    /// The field was `*` or `?`. See `day_mask` for why this matters.
    dom_star: bool,
    dow_star: bool,
}

impl fmt::Display for CronExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl std::str::FromStr for CronExpr {
    type Err = CronError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CronExpr::parse(s)
    }
}

impl CronExpr {
    /// Parses 5 fields (`min hour dom month dow`), 6 (`sec` first) or 7 (`year` last).
    pub fn parse(expr: &str) -> Result<CronExpr, CronError> {
        let fields: Vec<&str> = expr.split_whitespace().collect();
        let (sec, rest) = match fields.len() {
            5 => ("0", &fields[..]),
            6 | 7 => (fields[0], &fields[1..]),
            found => return Err(CronError::FieldCount { found }),
        };
        let seconds = parse_plain(sec, Field::Second)?;
        let minutes = parse_plain(rest[0], Field::Minute)?;
        let hours = parse_plain(rest[1], Field::Hour)?;
        let months = parse_plain(rest[3], Field::Month)?;
        let years = match rest.get(5) {
            None => YearSet::all(),
            Some(text) => parse_years(text)?,
        };
        let mut cron = CronExpr {
            source: fields.join(" "),
            seconds,
            minutes,
            hours,
            months,
            years,
            dom_days: 0,
            dom_last_minus: 0,
            dom_last_weekday: false,
            dom_nearest_weekday: 0,
            dow_days: 0,
            dow_last: 0,
            dow_nth: [0; 7],
            dom_star: false,
            dow_star: false,
        };
        cron.parse_dom(rest[2])?;
        cron.parse_dow(rest[4])?;
        Ok(cron)
    }

    /// The expression as written, whitespace normalised.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether a local date-time matches (its sub-second part is ignored).
    pub fn matches(&self, t: &NaiveDateTime) -> bool {
        self.years.contains(t.year())
            && bit(self.months, t.month())
            && self.day_mask(t.year(), t.month()) & (1 << t.day()) != 0
            && bit(self.hours, t.hour())
            && bit(self.minutes, t.minute())
            && bit(self.seconds, t.second())
    }

    /// The first matching local date-time at or after `from` (rounded up to a whole second),
    /// or None when there is none up to the end of MAX_YEAR.
    ///
    /// Walks year, month, day, then time of day over the bitsets, so a sparse expression costs a
    /// few dozen steps, and one that never matches (`0 0 0 30 FEB *`) at most one day-mask per
    /// month up to MAX_YEAR.
    pub fn next_local(&self, from: NaiveDateTime) -> Option<NaiveDateTime> {
        let mut from = from;
        if from.nanosecond() != 0 {
            from = from.with_nanosecond(0)? + chrono::Duration::seconds(1);
        }
        if from.year() < MIN_YEAR {
            from = NaiveDate::from_ymd_opt(MIN_YEAR, 1, 1)?.and_time(NaiveTime::MIN);
        }
        let from_date = from.date();
        for year in from.year()..=MAX_YEAR {
            if !self.years.contains(year) {
                continue;
            }
            let first_month = if year == from.year() { from.month() } else { 1 };
            for month in first_month..=12 {
                if !bit(self.months, month) {
                    continue;
                }
                let same_month = year == from.year() && month == from.month();
                let first_day = if same_month { from.day() } else { 1 };
                let mut days = self.day_mask(year, month) >> first_day << first_day;
                while days != 0 {
                    let day = days.trailing_zeros();
                    days &= days - 1;
                    let date = NaiveDate::from_ymd_opt(year, month, day)?;
                    let start = if date == from_date {
                        (from.hour(), from.minute(), from.second())
                    } else {
                        (0, 0, 0)
                    };
                    if let Some((h, m, s)) = self.next_time(start) {
                        return date.and_hms_opt(h, m, s);
                    }
                }
            }
        }
        None
    }

    /// The first matching time of day at or after `(h, m, s)`.
    fn next_time(&self, (h0, m0, s0): (u32, u32, u32)) -> Option<(u32, u32, u32)> {
        let mut hour = next_bit(self.hours, h0);
        while let Some(h) = hour {
            let m_from = if h == h0 { m0 } else { 0 };
            let mut minute = next_bit(self.minutes, m_from);
            while let Some(m) = minute {
                let s_from = if h == h0 && m == m0 { s0 } else { 0 };
                if let Some(s) = next_bit(self.seconds, s_from) {
                    return Some((h, m, s));
                }
                minute = next_bit(self.minutes, m + 1);
            }
            hour = next_bit(self.hours, h + 1);
        }
        None
    }

    /// The matching days of a month as bits 1..=31.
    fn day_mask(&self, year: i32, month: u32) -> u64 {
        let Some(first) = NaiveDate::from_ymd_opt(year, month, 1) else {
            return 0;
        };
        let dim = days_in_month(year, month);
        let valid = ((1u64 << (dim + 1)) - 1) & !1;
        let weekday_of = |day: u32| (first.weekday().num_days_from_sunday() + day - 1) % 7;

        let mut dom = self.dom_days & valid;
        let mut minus = self.dom_last_minus;
        while minus != 0 {
            let n = minus.trailing_zeros();
            minus &= minus - 1;
            if n < dim {
                dom |= 1 << (dim - n);
            }
        }
        if self.dom_last_weekday {
            let last = match weekday_of(dim) {
                6 => dim - 1,
                0 => dim - 2,
                _ => dim,
            };
            dom |= 1 << last;
        }
        let mut nearest = self.dom_nearest_weekday;
        while nearest != 0 {
            let n = nearest.trailing_zeros();
            nearest &= nearest - 1;
            // A day the month lacks matches nothing, as a plain `31` does not in April.
            if n > dim {
                continue;
            }
            // Never crosses into another month: 1W on a Saturday is Monday the 3rd.
            let day = match weekday_of(n) {
                6 if n == 1 => 3,
                6 => n - 1,
                0 if n == dim => n - 2,
                0 => n + 1,
                _ => n,
            };
            dom |= 1 << day;
        }

        let mut dow = 0u64;
        for day in 1..=dim {
            let wd = weekday_of(day);
            if bit(self.dow_days, wd) {
                dow |= 1 << day;
            }
            // The last such weekday: no same weekday a week later in this month.
            if bit(self.dow_last, wd) && day + 7 > dim {
                dow |= 1 << day;
            }
            if self.dow_nth[wd as usize] & (1 << ((day - 1) / 7 + 1)) != 0 {
                dow |= 1 << day;
            }
        }

        // Vixie cron: when both fields are restricted a day matches if either does; otherwise
        // the restricted one decides (a `*`/`?` field matches every day, so AND does that).
        // Unlike Vixie we call only a bare `*` or `?` unrestricted: `*/2` restricts, because that
        // is what it says and Vixie's treatment of it is a well-known surprise.
        let dom = if self.dom_star { valid } else { dom };
        let dow = if self.dow_star { valid } else { dow };
        if self.dom_star || self.dow_star {
            dom & dow
        } else {
            dom | dow
        }
    }

    fn parse_dom(&mut self, text: &str) -> Result<(), CronError> {
        let field = Field::DayOfMonth;
        if text == "*" || text == "?" {
            self.dom_star = true;
            self.dom_days = mask_range(1, 31);
            return Ok(());
        }
        for item in text.split(',') {
            let upper = item.to_ascii_uppercase();
            if upper == "L" {
                self.dom_last_minus |= 1;
            } else if upper == "LW" {
                self.dom_last_weekday = true;
            } else if let Some(n) = upper.strip_prefix("L-") {
                let n = parse_number(n, field, item)?;
                if n > 30 {
                    return Err(CronError::OutOfRange {
                        field,
                        value: n,
                        min: 0,
                        max: 30,
                    });
                }
                self.dom_last_minus |= 1 << n;
            } else if let Some(n) = upper.strip_suffix('W') {
                let n = parse_number(n, field, item)?;
                check_range(n, field)?;
                self.dom_nearest_weekday |= 1 << n;
            } else if item == "?" {
                return Err(CronError::NotAllowed {
                    field,
                    token: "? in a list".into(),
                });
            } else {
                self.dom_days |= parse_item(item, field)?;
            }
        }
        Ok(())
    }

    fn parse_dow(&mut self, text: &str) -> Result<(), CronError> {
        let field = Field::DayOfWeek;
        if text == "*" || text == "?" {
            self.dow_star = true;
            self.dow_days = mask_range(0, 6);
            return Ok(());
        }
        for item in text.split(',') {
            let upper = item.to_ascii_uppercase();
            if let Some((day, k)) = upper.split_once('#') {
                let wd = parse_weekday(day, item)?;
                let k = parse_number(k, field, item)?;
                if !(1..=5).contains(&k) {
                    return Err(CronError::NthOutOfRange {
                        item: item.into(),
                        k,
                    });
                }
                self.dow_nth[wd as usize] |= 1 << k;
            } else if upper.len() > 1 && upper.ends_with('L') {
                let wd = parse_weekday(&upper[..upper.len() - 1], item)?;
                self.dow_last |= 1 << wd;
            } else if upper == "L" {
                // Quartz reads a lone L as Saturday, which surprises everyone with 0 = Sunday.
                return Err(CronError::NotAllowed {
                    field,
                    token: "L without a weekday (write e.g. 5L or FRIL)".into(),
                });
            } else if item == "?" {
                return Err(CronError::NotAllowed {
                    field,
                    token: "? in a list".into(),
                });
            } else {
                let bits = parse_item(item, field)?;
                // 7 is Sunday too.
                self.dow_days |= (bits & 0x7f) | ((bits >> 7) & 1);
            }
        }
        Ok(())
    }
}

/// A comma list of plain items (second, minute, hour, month).
fn parse_plain(text: &str, field: Field) -> Result<u64, CronError> {
    text.split(',')
        .try_fold(0, |acc, item| Ok(acc | parse_item(item, field)?))
}

fn bit(mask: u64, i: u32) -> bool {
    i < 64 && mask & (1 << i) != 0
}

/// The lowest set bit at or above `from`.
fn next_bit(mask: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let rest = mask >> from;
    (rest != 0).then(|| from + rest.trailing_zeros())
}

fn mask_range(lo: u32, hi: u32) -> u64 {
    (lo..=hi).fold(0, |m, i| m | 1 << i)
}

fn days_in_month(year: i32, month: u32) -> u32 {
    let (ny, nm) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    match (
        NaiveDate::from_ymd_opt(year, month, 1),
        NaiveDate::from_ymd_opt(ny, nm, 1),
    ) {
        (Some(a), Some(b)) => (b - a).num_days() as u32,
        _ => 0,
    }
}

fn check_range(value: u64, field: Field) -> Result<u32, CronError> {
    let (min, max) = field.bounds();
    if value < min as u64 || value > max as u64 {
        return Err(CronError::OutOfRange {
            field,
            value,
            min,
            max,
        });
    }
    Ok(value as u32)
}

fn parse_number(text: &str, field: Field, item: &str) -> Result<u64, CronError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CronError::Invalid {
            field,
            text: item.into(),
        });
    }
    // Absurdly long digit strings saturate, then fail the range check with a clear message.
    Ok(text.parse::<u64>().unwrap_or(u64::MAX))
}

/// A single value: a number or, in month and day-of-week, a name.
fn parse_value(text: &str, field: Field) -> Result<u32, CronError> {
    let names: &[&str] = match field {
        Field::Month => &MONTH_NAMES,
        Field::DayOfWeek => &DAY_NAMES,
        _ => &[],
    };
    if !names.is_empty() && text.bytes().any(|b| b.is_ascii_alphabetic()) {
        let upper = text.to_ascii_uppercase();
        let base = if field == Field::Month { 1 } else { 0 };
        return names
            .iter()
            .position(|n| *n == upper)
            .map(|i| i as u32 + base)
            .ok_or_else(|| CronError::UnknownName {
                field,
                name: text.into(),
            });
    }
    check_range(parse_number(text, field, text)?, field)
}

fn parse_weekday(text: &str, item: &str) -> Result<u32, CronError> {
    if text.is_empty() {
        return Err(CronError::Invalid {
            field: Field::DayOfWeek,
            text: item.into(),
        });
    }
    Ok(parse_value(text, Field::DayOfWeek)? % 7)
}

/// One list item: `*`, `v`, `a-b`, each optionally `/step`; `v/step` means `v-max/step`.
/// Returns bits for the field's own numbering (day-of-week keeps 7 for the caller to fold).
fn parse_item(item: &str, field: Field) -> Result<u64, CronError> {
    if item.is_empty() {
        return Err(CronError::EmptyItem { field });
    }
    let (min, max) = field.bounds();
    let (base, step) = match item.split_once('/') {
        Some((base, step)) => (base, Some(parse_step(step, field, item)?)),
        None => (item, None),
    };
    let (lo, hi) = if base == "*" {
        // Day-of-week `*/2` is Sun, Tue, Thu, Sat: step over 0-6, not 0-7.
        (min, if field == Field::DayOfWeek { 6 } else { max })
    } else if base == "?" {
        return Err(CronError::NotAllowed {
            field,
            token: "?".into(),
        });
    } else if let Some((a, b)) = base.split_once('-') {
        let lo = parse_value(a, field)?;
        let mut hi = parse_value(b, field)?;
        // MON-SUN reads naturally as Monday to Sunday; let the name SUN end a range as 7.
        if field == Field::DayOfWeek && hi == 0 && b.eq_ignore_ascii_case("SUN") {
            hi = 7;
        }
        if lo > hi {
            return Err(CronError::ReversedRange {
                field,
                start: lo,
                end: hi,
            });
        }
        (lo, hi)
    } else {
        let v = parse_value(base, field)?;
        match step {
            Some(_) => (
                v,
                if field == Field::DayOfWeek {
                    v.max(6)
                } else {
                    max
                },
            ),
            None => (v, v),
        }
    };
    let step = step.unwrap_or(1);
    // Bounded by the field's width (`parse_step`), so neither the shift nor the add can wrap;
    // `step_by` keeps it that way without a hand-written increment.
    Ok((lo..=hi)
        .step_by(step as usize)
        .fold(0u64, |bits, v| bits | 1 << v))
}

/// A step: 1 up to the field's width (60 for seconds, 7 for day-of-week, the year span for
/// years). A larger one could only ever match its start, and would overflow the arithmetic.
fn parse_step(text: &str, field: Field, item: &str) -> Result<u64, CronError> {
    let step = parse_number(text, field, item)?;
    if step == 0 {
        return Err(CronError::ZeroStep { field });
    }
    let (min, max) = field.bounds();
    // Day-of-week steps run over 0-6 (7 is Sunday's second name, not an eighth day).
    let width = if field == Field::DayOfWeek {
        7
    } else {
        max - min + 1
    };
    if step > u64::from(width) {
        return Err(CronError::StepTooLarge {
            field,
            step,
            max: width,
        });
    }
    Ok(step)
}

fn parse_years(text: &str) -> Result<YearSet, CronError> {
    if text == "*" {
        return Ok(YearSet::all());
    }
    let field = Field::Year;
    let mut set = YearSet([0; YEAR_WORDS]);
    for item in text.split(',') {
        if item.is_empty() {
            return Err(CronError::EmptyItem { field });
        }
        // Years do not fit a u64 mask, so this repeats parse_item's grammar over i32.
        let (base, step) = match item.split_once('/') {
            Some((base, step)) => (base, parse_step(step, field, item)?),
            None => (item, 0),
        };
        let (lo, hi) = if base == "*" {
            (MIN_YEAR as u32, MAX_YEAR as u32)
        } else if let Some((a, b)) = base.split_once('-') {
            let lo = parse_value(a, field)?;
            let hi = parse_value(b, field)?;
            if lo > hi {
                return Err(CronError::ReversedRange {
                    field,
                    start: lo,
                    end: hi,
                });
            }
            (lo, hi)
        } else {
            let v = parse_value(base, field)?;
            (v, if step > 0 { MAX_YEAR as u32 } else { v })
        };
        for y in (lo..=hi).step_by(step.max(1) as usize) {
            set.insert(y as i32);
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dt(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").unwrap()
    }

    fn next(expr: &str, from: &str) -> Option<String> {
        CronExpr::parse(expr)
            .unwrap()
            .next_local(dt(from))
            .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
    }

    fn nexts(expr: &str, from: &str, n: usize) -> Vec<String> {
        let cron = CronExpr::parse(expr).unwrap();
        let mut out = Vec::new();
        let mut t = dt(from);
        for _ in 0..n {
            let Some(m) = cron.next_local(t) else { break };
            out.push(m.format("%Y-%m-%d %H:%M:%S").to_string());
            t = m + chrono::Duration::seconds(1);
        }
        out
    }

    fn err(expr: &str) -> String {
        CronExpr::parse(expr).unwrap_err().to_string()
    }

    #[test]
    fn five_fields_fire_at_second_zero() {
        assert_eq!(
            nexts("*/15 * * * *", "2025-01-01 00:00:01", 3),
            [
                "2025-01-01 00:15:00",
                "2025-01-01 00:30:00",
                "2025-01-01 00:45:00"
            ]
        );
    }

    #[test]
    fn six_fields_have_seconds() {
        assert_eq!(
            nexts("*/20 * * * * *", "2025-01-01 00:00:00", 4),
            [
                "2025-01-01 00:00:00",
                "2025-01-01 00:00:20",
                "2025-01-01 00:00:40",
                "2025-01-01 00:01:00"
            ]
        );
    }

    #[test]
    fn seven_fields_restrict_years() {
        assert_eq!(
            nexts("0 0 12 1 1 * 2030,2032-2033", "2025-06-01 00:00:00", 5),
            [
                "2030-01-01 12:00:00",
                "2032-01-01 12:00:00",
                "2033-01-01 12:00:00"
            ]
        );
        assert_eq!(
            nexts("0 0 0 1 1 ? 2000/50", "1970-01-01 00:00:00", 5),
            ["2000-01-01 00:00:00", "2050-01-01 00:00:00"]
        );
    }

    #[test]
    fn ranges_steps_and_lists() {
        assert_eq!(
            nexts("0 5-40/10 9 * * *", "2025-01-01 00:00:00", 5),
            [
                "2025-01-01 09:05:00",
                "2025-01-01 09:15:00",
                "2025-01-01 09:25:00",
                "2025-01-01 09:35:00",
                "2025-01-02 09:05:00"
            ]
        );
        // `10/20` is 10-59/20.
        assert_eq!(
            nexts("0 10/20 9 * * *", "2025-01-01 00:00:00", 4),
            [
                "2025-01-01 09:10:00",
                "2025-01-01 09:30:00",
                "2025-01-01 09:50:00",
                "2025-01-02 09:10:00"
            ]
        );
        assert_eq!(
            nexts("0 0 1,13,22 * * *", "2025-01-01 02:00:00", 3),
            [
                "2025-01-01 13:00:00",
                "2025-01-01 22:00:00",
                "2025-01-02 01:00:00"
            ]
        );
    }

    #[test]
    fn month_and_day_names_any_case() {
        // 2025-01-01 is a Wednesday.
        assert_eq!(
            nexts("0 0 0 * jan-Feb mon,FRI", "2025-01-01 00:00:00", 3),
            [
                "2025-01-03 00:00:00",
                "2025-01-06 00:00:00",
                "2025-01-10 00:00:00"
            ]
        );
        assert_eq!(
            next("0 0 0 1 DEC *", "2025-01-01 00:00:00").as_deref(),
            Some("2025-12-01 00:00:00")
        );
        assert_eq!(
            nexts("0 0 0 * * MON-SUN", "2025-01-01 00:00:00", 10),
            nexts("0 0 0 * * 1-7", "2025-01-01 00:00:00", 10)
        );
        assert_eq!(
            nexts("0 0 0 * * 1-7", "2025-01-01 00:00:00", 10),
            nexts("0 0 0 * * *", "2025-01-01 00:00:00", 10)
        );
    }

    #[test]
    fn sunday_is_0_and_7() {
        let zero = nexts("0 0 0 * * 0", "2025-01-01 00:00:00", 3);
        assert_eq!(zero, nexts("0 0 0 * * 7", "2025-01-01 00:00:00", 3));
        assert_eq!(zero, nexts("0 0 0 * * sun", "2025-01-01 00:00:00", 3));
        // 2025-01-05 is a Sunday.
        assert_eq!(zero[0], "2025-01-05 00:00:00");
        assert_eq!(
            nexts("0 0 0 * * 5-7", "2025-01-01 00:00:00", 3),
            [
                "2025-01-03 00:00:00",
                "2025-01-04 00:00:00",
                "2025-01-05 00:00:00"
            ]
        );
    }

    #[test]
    fn vixie_day_rule() {
        // Both restricted: the 13th OR any Friday. 2025-06-06 is a Friday.
        assert_eq!(
            nexts("0 0 0 13 * FRI", "2025-06-01 00:00:00", 3),
            [
                "2025-06-06 00:00:00",
                "2025-06-13 00:00:00",
                "2025-06-20 00:00:00"
            ]
        );
        // Only dow restricted: Fridays only.
        assert_eq!(
            nexts("0 0 0 * * FRI", "2025-06-01 00:00:00", 2),
            ["2025-06-06 00:00:00", "2025-06-13 00:00:00"]
        );
        assert_eq!(
            nexts("0 0 0 ? * FRI", "2025-06-01 00:00:00", 2),
            ["2025-06-06 00:00:00", "2025-06-13 00:00:00"]
        );
        // Only dom restricted: the 13th only.
        assert_eq!(
            nexts("0 0 0 13 * ?", "2025-06-01 00:00:00", 2),
            ["2025-06-13 00:00:00", "2025-07-13 00:00:00"]
        );
    }

    #[test]
    fn feb_29_only_in_leap_years() {
        assert_eq!(
            nexts("0 0 0 29 2 *", "2025-01-01 00:00:00", 3),
            [
                "2028-02-29 00:00:00",
                "2032-02-29 00:00:00",
                "2036-02-29 00:00:00"
            ]
        );
        // 2000 is a leap year (divisible by 400); 2100, past the horizon, would not be.
        assert_eq!(
            next("0 0 0 29 FEB *", "1997-01-01 00:00:00").as_deref(),
            Some("2000-02-29 00:00:00")
        );
        assert_eq!(next("0 0 0 29 FEB *", "2096-03-01 00:00:00"), None);
    }

    #[test]
    fn never_matching_terminates() {
        let started = std::time::Instant::now();
        assert_eq!(next("0 0 0 30 FEB *", "1970-01-01 00:00:00"), None);
        assert_eq!(next("0 0 0 31 4,6,9,11 *", "1970-01-01 00:00:00"), None);
        assert_eq!(next("* * * * * * 2020", "2021-01-01 00:00:00"), None);
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn gives_up_after_max_year() {
        assert_eq!(
            next("0 0 0 1 1 *", "2099-01-01 00:00:00").as_deref(),
            Some("2099-01-01 00:00:00")
        );
        assert_eq!(next("0 0 0 1 1 *", "2099-01-01 00:00:01"), None);
        assert_eq!(
            next("0 0 0 1 1 *", "1901-05-05 00:00:00").as_deref(),
            Some("1970-01-01 00:00:00")
        );
    }

    #[test]
    fn last_day_and_offsets() {
        assert_eq!(
            nexts("0 0 0 L * *", "2024-01-15 00:00:00", 3),
            [
                "2024-01-31 00:00:00",
                "2024-02-29 00:00:00",
                "2024-03-31 00:00:00"
            ]
        );
        assert_eq!(
            nexts("0 0 0 L-2 * *", "2025-01-01 00:00:00", 3),
            [
                "2025-01-29 00:00:00",
                "2025-02-26 00:00:00",
                "2025-03-29 00:00:00"
            ]
        );
    }

    #[test]
    fn nearest_weekday() {
        // 2025-03-15 is a Saturday -> Friday 14th; 2025-06-15 is a Sunday -> Monday 16th;
        // 2025-01-15 is a Wednesday.
        assert_eq!(
            next("0 0 0 15W * *", "2025-03-01 00:00:00").as_deref(),
            Some("2025-03-14 00:00:00")
        );
        assert_eq!(
            next("0 0 0 15W * *", "2025-06-01 00:00:00").as_deref(),
            Some("2025-06-16 00:00:00")
        );
        assert_eq!(
            next("0 0 0 15W * *", "2025-01-01 00:00:00").as_deref(),
            Some("2025-01-15 00:00:00")
        );
        // 2025-03-01 is a Saturday: 1W stays in March, Monday the 3rd.
        assert_eq!(
            next("0 0 0 1W * *", "2025-03-01 00:00:00").as_deref(),
            Some("2025-03-03 00:00:00")
        );
        // 2025-08-31 is a Sunday: 31W stays in August, Friday the 29th.
        assert_eq!(
            next("0 0 0 31W 8 *", "2025-08-01 00:00:00").as_deref(),
            Some("2025-08-29 00:00:00")
        );
    }

    #[test]
    fn last_weekday_of_month() {
        // 2025-05-31 is a Saturday -> 30th; 2025-08-31 is a Sunday -> 29th;
        // 2025-06-30 is a Monday.
        assert_eq!(
            nexts("0 0 0 LW 5,6,8 *", "2025-01-01 00:00:00", 3),
            [
                "2025-05-30 00:00:00",
                "2025-06-30 00:00:00",
                "2025-08-29 00:00:00"
            ]
        );
    }

    #[test]
    fn last_and_nth_weekday() {
        // Last Friday: 2025-01-31, 2025-02-28, 2025-03-28.
        let want = [
            "2025-01-31 00:00:00",
            "2025-02-28 00:00:00",
            "2025-03-28 00:00:00",
        ];
        assert_eq!(nexts("0 0 0 ? * 5L", "2025-01-01 00:00:00", 3), want);
        assert_eq!(nexts("0 0 0 ? * FRIL", "2025-01-01 00:00:00", 3), want);
        // Second Monday: 2025-01-13, 2025-02-10, 2025-03-10.
        let want = [
            "2025-01-13 00:00:00",
            "2025-02-10 00:00:00",
            "2025-03-10 00:00:00",
        ];
        assert_eq!(nexts("0 0 0 ? * MON#2", "2025-01-01 00:00:00", 3), want);
        assert_eq!(nexts("0 0 0 ? * 1#2", "2025-01-01 00:00:00", 3), want);
        // A fifth Thursday exists only in some months: Jan, May, Jul, Oct 2025.
        assert_eq!(
            nexts("0 0 0 ? * THU#5", "2025-01-01 00:00:00", 4),
            [
                "2025-01-30 00:00:00",
                "2025-05-29 00:00:00",
                "2025-07-31 00:00:00",
                "2025-10-30 00:00:00"
            ]
        );
    }

    #[test]
    fn matches_agrees_with_next_local() {
        let cron = CronExpr::parse("30 15 10 L-1,15W * MON#1").unwrap();
        let mut t = dt("2025-01-01 00:00:00");
        for _ in 0..20 {
            let m = cron.next_local(t).unwrap();
            assert!(cron.matches(&m));
            assert!(!cron.matches(&(m - chrono::Duration::seconds(1))));
            t = m + chrono::Duration::seconds(1);
        }
    }

    #[test]
    fn errors_name_value_and_rule() {
        assert_eq!(err("61 * * * * *"), "second 61 out of range 0-59");
        assert_eq!(err("* * * *"), "expected 5, 6 or 7 fields, found 4");
        assert_eq!(err("0 0 0 1 2 3 4 5"), "expected 5, 6 or 7 fields, found 8");
        assert_eq!(err("0 0 1 FOO *"), "unknown month name \"FOO\"");
        assert_eq!(err("0 0 1 * FUNDAY"), "unknown day-of-week name \"FUNDAY\"");
        assert_eq!(err("*/0 * * * *"), "minute step 0 is not allowed");
        assert_eq!(err("0 24 * * *"), "hour 24 out of range 0-23");
        assert_eq!(err("0 0 32 * *"), "day-of-month 32 out of range 1-31");
        assert_eq!(err("0 0 0 * 13 *"), "month 13 out of range 1-12");
        assert_eq!(err("0 0 0 * * 8"), "day-of-week 8 out of range 0-7");
        assert_eq!(err("0 0 0 * * * 2100"), "year 2100 out of range 1970-2099");
        assert_eq!(
            err("30-10 0 * * *"),
            "minute range 30-10 is reversed: the start must not exceed the end"
        );
        assert_eq!(err("0 x * * *"), "invalid hour value \"x\"");
        assert_eq!(err("? * * * *"), "minute does not allow \"?\"");
        assert_eq!(
            err("0 0 * * MON#6"),
            "week-of-month 6 in \"MON#6\" out of range 1-5"
        );
        assert_eq!(err("0 0 L-31 * *"), "day-of-month 31 out of range 0-30");
        assert_eq!(err("1,,2 0 * * *"), "empty item in minute list");
        assert!(err("0 0 * * L").contains("L without a weekday"));
        assert_eq!(
            err("0 0 0 1 * * 99999999999999999999999"),
            format!("year {} out of range 1970-2099", u64::MAX)
        );
    }

    #[test]
    fn steps_are_capped_at_the_fields_width() {
        // These once wrapped: a panic in `YearSet::insert`, or seconds 0-5 for `5/2^64-1`.
        assert_eq!(
            err("0 0 0 1 1 * 2000/18446744073709551615"),
            "year step 18446744073709551615 out of range 1-130: a step may not exceed the \
             field's width"
        );
        assert_eq!(
            err("5/18446744073709551615 * * * * *"),
            "second step 18446744073709551615 out of range 1-60: a step may not exceed the \
             field's width"
        );
        assert_eq!(
            err("0 0 0 * * 6/18446744073709551614"),
            "day-of-week step 18446744073709551614 out of range 1-7: a step may not exceed the \
             field's width"
        );
        assert_eq!(
            err("0 0 0 * * 1/99999999999999999999999"),
            format!(
                "day-of-week step {} out of range 1-7: a step may not exceed the field's width",
                u64::MAX
            )
        );
        // A step of the whole width is allowed and matches the start only.
        assert_eq!(
            nexts("5/60 * * * * *", "2025-01-01 00:00:00", 2),
            ["2025-01-01 00:00:05", "2025-01-01 00:01:05"]
        );
        assert_eq!(
            nexts("0 0 0 * * 6/7", "2025-01-01 00:00:00", 2),
            ["2025-01-04 00:00:00", "2025-01-11 00:00:00"]
        );
    }

    proptest::proptest! {
        /// No expression built from the grammar's pieces, with any numbers at all, panics.
        #[test]
        fn parse_never_panics(
            fields in proptest::collection::vec(
                (0u64..u64::MAX, 0u64..u64::MAX, 0usize..6),
                5..8,
            )
        ) {
            let expr: Vec<String> = fields
                .iter()
                .map(|(a, b, form)| match form {
                    0 => format!("{a}"),
                    1 => format!("{a}/{b}"),
                    2 => format!("*/{b}"),
                    3 => format!("{}-{}/{b}", a % 64, b % 64),
                    4 => format!("{}L", a % 64),
                    _ => format!("{}#{}", a % 8, b),
                })
                .collect();
            if let Ok(cron) = CronExpr::parse(&expr.join(" ")) {
                let _ = cron.next_local(dt("2025-01-01 00:00:00"));
            }
        }
    }
}
