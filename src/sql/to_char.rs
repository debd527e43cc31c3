//! `to_char(timestamp, text)` with PostgreSQL's template patterns (`YYYY-MM-DD HH24:MI:SS`,
//! `Month`, `FMDD`, `DDth` ...), for `timestamp`, `timestamptz` (in UTC, the only time zone a
//! session has) and `date`. DataFusion's own `to_char` reads chrono's patterns (`%Y-%m-%d`),
//! which PostgreSQL prints as they are: a template means what it means in PostgreSQL.
//! `to_char` of numbers and intervals is refused (0A000).

use std::sync::Arc;

use chrono::{DateTime, Datelike, NaiveDateTime, Timelike};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, TimeUnit, TimestampMicrosecondType};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use crate::error::{Error, ErrorKind};

/// A field of a template and what it prints.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Hour24,
    Hour12,
    Minute,
    Second,
    Millis,
    Micros,
    /// FF1 to FF6: that many digits of the second's fraction.
    Fraction(u8),
    SecondsOfDay,
    /// AM/PM in the spelling given (upper, with dots).
    Meridiem {
        upper: bool,
        dots: bool,
    },
    /// BC/AD likewise.
    Era {
        upper: bool,
        dots: bool,
    },
    YearComma,
    /// The year's last `n` digits (4: the whole year, at least four digits).
    Year(u8),
    IsoYear(u8),
    /// A name: the month's or the day's, whole or abbreviated, in the case given.
    MonthName {
        case: Case,
        short: bool,
    },
    DayName {
        case: Case,
        short: bool,
    },
    RomanMonth {
        upper: bool,
    },
    Month,
    DayOfYear,
    IsoDayOfYear,
    DayOfMonth,
    DayOfWeek,
    IsoDayOfWeek,
    WeekOfMonth,
    WeekOfYear,
    IsoWeek,
    Quarter,
    Century,
    Julian,
    /// TZ/tz: the zone's abbreviation; OF, TZH, TZM: its offset.
    Zone {
        upper: bool,
    },
    Offset,
    OffsetHours,
    OffsetMinutes,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    Upper,
    Capital,
    Lower,
}

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Field {
        field: Field,
        /// FM: no padding.
        fill: bool,
        /// TH/th: an ordinal suffix, upper or lower case.
        ordinal: Option<bool>,
    },
}

/// PostgreSQL's keywords in upper case, longest first where one is the start of another (its
/// table's order). Each is read in lower case too, and a month's or day's name capitalized
/// (`Month`, `Dy`): the case a name, a marker or the zone prints in is the template's.
const KEYWORDS: &[(&str, Field)] = &[
    (
        "A.D.",
        Field::Era {
            upper: true,
            dots: true,
        },
    ),
    (
        "A.M.",
        Field::Meridiem {
            upper: true,
            dots: true,
        },
    ),
    (
        "AD",
        Field::Era {
            upper: true,
            dots: false,
        },
    ),
    (
        "AM",
        Field::Meridiem {
            upper: true,
            dots: false,
        },
    ),
    (
        "B.C.",
        Field::Era {
            upper: true,
            dots: true,
        },
    ),
    (
        "BC",
        Field::Era {
            upper: true,
            dots: false,
        },
    ),
    ("CC", Field::Century),
    (
        "DAY",
        Field::DayName {
            case: Case::Upper,
            short: false,
        },
    ),
    ("DDD", Field::DayOfYear),
    ("DD", Field::DayOfMonth),
    (
        "DY",
        Field::DayName {
            case: Case::Upper,
            short: true,
        },
    ),
    ("D", Field::DayOfWeek),
    ("FF1", Field::Fraction(1)),
    ("FF2", Field::Fraction(2)),
    ("FF3", Field::Fraction(3)),
    ("FF4", Field::Fraction(4)),
    ("FF5", Field::Fraction(5)),
    ("FF6", Field::Fraction(6)),
    ("HH24", Field::Hour24),
    ("HH12", Field::Hour12),
    ("HH", Field::Hour12),
    ("IDDD", Field::IsoDayOfYear),
    ("ID", Field::IsoDayOfWeek),
    ("IW", Field::IsoWeek),
    ("IYYY", Field::IsoYear(4)),
    ("IYY", Field::IsoYear(3)),
    ("IY", Field::IsoYear(2)),
    ("I", Field::IsoYear(1)),
    ("J", Field::Julian),
    ("MI", Field::Minute),
    ("MM", Field::Month),
    (
        "MONTH",
        Field::MonthName {
            case: Case::Upper,
            short: false,
        },
    ),
    (
        "MON",
        Field::MonthName {
            case: Case::Upper,
            short: true,
        },
    ),
    ("MS", Field::Millis),
    ("OF", Field::Offset),
    (
        "P.M.",
        Field::Meridiem {
            upper: true,
            dots: true,
        },
    ),
    (
        "PM",
        Field::Meridiem {
            upper: true,
            dots: false,
        },
    ),
    ("Q", Field::Quarter),
    ("RM", Field::RomanMonth { upper: true }),
    ("SSSSS", Field::SecondsOfDay),
    ("SSSS", Field::SecondsOfDay),
    ("SS", Field::Second),
    ("TZH", Field::OffsetHours),
    ("TZM", Field::OffsetMinutes),
    ("TZ", Field::Zone { upper: true }),
    ("US", Field::Micros),
    ("WW", Field::WeekOfYear),
    ("W", Field::WeekOfMonth),
    ("Y,YYY", Field::YearComma),
    ("YYYY", Field::Year(4)),
    ("YYY", Field::Year(3)),
    ("YY", Field::Year(2)),
    ("Y", Field::Year(1)),
];

/// The keyword `s` starts with: its length, and its field in the case `s` spells it.
fn keyword(s: &str) -> Option<(usize, Field)> {
    let lower = |head: &[u8], k: &[u8]| {
        head.iter()
            .zip(k)
            .all(|(h, k)| *h == k.to_ascii_lowercase())
    };
    KEYWORDS.iter().find_map(|&(k, field)| {
        let (head, k) = (s.as_bytes().get(..k.len())?, k.as_bytes());
        let case = if head == k {
            Case::Upper
        } else if lower(head, k) {
            Case::Lower
        } else if matches!(field, Field::MonthName { .. } | Field::DayName { .. })
            && head[0] == k[0]
            && lower(&head[1..], &k[1..])
        {
            Case::Capital
        } else {
            return None;
        };
        Some((k.len(), field.in_case(case)))
    })
}

impl Field {
    /// The field printing in `case` (for the fields that print words).
    fn in_case(self, case: Case) -> Field {
        let upper = case == Case::Upper;
        match self {
            Field::Meridiem { dots, .. } => Field::Meridiem { upper, dots },
            Field::Era { dots, .. } => Field::Era { upper, dots },
            Field::MonthName { short, .. } => Field::MonthName { case, short },
            Field::DayName { short, .. } => Field::DayName { case, short },
            Field::RomanMonth { .. } => Field::RomanMonth { upper },
            Field::Zone { .. } => Field::Zone { upper },
            other => other,
        }
    }
}

/// Fields that print a number, which TH/th can follow.
fn numeric(field: Field) -> bool {
    !matches!(
        field,
        Field::Meridiem { .. }
            | Field::Era { .. }
            | Field::MonthName { .. }
            | Field::DayName { .. }
            | Field::RomanMonth { .. }
            | Field::Zone { .. }
            | Field::Offset
            | Field::OffsetHours
            | Field::OffsetMinutes
    )
}

/// A template's pieces, as PostgreSQL reads them: keywords with their FM prefix and TH
/// suffix, double-quoted text (a backslash escapes a quote), and every other character as it
/// is (FX and TM, which change nothing a `to_char` in English prints, are dropped).
fn parse(template: &str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = template;
    while let Some(c) = rest.chars().next() {
        if c == '"' {
            let mut chars = rest[1..].char_indices();
            let mut end = rest.len();
            while let Some((i, q)) = chars.next() {
                match q {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            text.push(escaped);
                        }
                    }
                    '"' => {
                        end = i + 2;
                        break;
                    }
                    other => text.push(other),
                }
            }
            rest = &rest[end..];
            continue;
        }
        if c == '\\' && rest[1..].starts_with('"') {
            text.push('"');
            rest = &rest[2..];
            continue;
        }
        let mut fill = false;
        let mut after = rest;
        loop {
            if let Some(r) = strip_any(after, &["FM", "fm"]) {
                fill = true;
                after = r;
            } else if let Some(r) = strip_any(after, &["FX", "fx", "TM", "tm"]) {
                after = r;
            } else {
                break;
            }
        }
        match keyword(after) {
            Some((len, field)) => {
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                after = &after[len..];
                let mut ordinal = None;
                if numeric(field) {
                    if let Some(r) = after.strip_prefix("TH") {
                        ordinal = Some(true);
                        after = r;
                    } else if let Some(r) = after.strip_prefix("th") {
                        ordinal = Some(false);
                        after = r;
                    }
                }
                pieces.push(Piece::Field {
                    field,
                    fill,
                    ordinal,
                });
                rest = after;
            }
            None if after.len() < rest.len() => rest = after,
            None => {
                text.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    pieces
}

fn strip_any<'a>(s: &'a str, prefixes: &[&str]) -> Option<&'a str> {
    prefixes.iter().find_map(|p| s.strip_prefix(p))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const ROMAN: [&str; 12] = [
    "I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII",
];
/// The Julian day of 0001-01-01 less one: chrono counts days from it, day 1 being that date.
const JULIAN_OF_CE: i64 = 1_721_425;

/// Writes `t` as the template's pieces say.
fn format(pieces: &[Piece], t: &NaiveDateTime, zoned: bool, out: &mut String) {
    for piece in pieces {
        match piece {
            Piece::Text(s) => out.push_str(s),
            Piece::Field {
                field,
                fill,
                ordinal,
            } => {
                let start = out.len();
                field_text(*field, *fill, t, zoned, out);
                if let Some(upper) = ordinal {
                    let digits = &out[start..];
                    let suffix = ordinal_suffix(digits);
                    out.push_str(&if *upper {
                        suffix.to_uppercase()
                    } else {
                        suffix.to_string()
                    });
                }
            }
        }
    }
}

fn ordinal_suffix(digits: &str) -> &'static str {
    let n: u64 = digits
        .trim()
        .trim_start_matches('-')
        .parse()
        .unwrap_or_default();
    match (n % 100, n % 10) {
        (11..=13, _) => "th",
        (_, 1) => "st",
        (_, 2) => "nd",
        (_, 3) => "rd",
        _ => "th",
    }
}

fn number(out: &mut String, value: i64, width: usize, fill: bool) {
    if fill {
        out.push_str(&value.to_string());
    } else if value < 0 {
        out.push_str(&format!(
            "-{:0width$}",
            -value,
            width = width.saturating_sub(1)
        ));
    } else {
        out.push_str(&format!("{value:0width$}"));
    }
}

fn name(out: &mut String, name: &str, case: Case, short: bool, fill: bool) {
    let name = if short { &name[..3] } else { name };
    let cased = match case {
        Case::Upper => name.to_uppercase(),
        Case::Capital => name.to_string(),
        Case::Lower => name.to_lowercase(),
    };
    if short || fill {
        out.push_str(&cased);
    } else {
        // PostgreSQL pads whole names to the longest's nine characters.
        out.push_str(&format!("{cased:<9}"));
    }
}

fn meridiem(out: &mut String, upper: bool, dots: bool, first: char) {
    let text = if dots {
        format!("{first}.m.")
    } else {
        format!("{first}m")
    };
    out.push_str(&if upper { text.to_uppercase() } else { text });
}

fn field_text(field: Field, fill: bool, t: &NaiveDateTime, zoned: bool, out: &mut String) {
    let year = i64::from(t.year());
    // PostgreSQL prints years before 1 as positive years BC.
    let shown_year = if year <= 0 { 1 - year } else { year };
    let hour12 = match t.hour() % 12 {
        0 => 12,
        h => h,
    };
    let micros = i64::from(t.nanosecond() / 1000);
    match field {
        Field::Hour24 => number(out, i64::from(t.hour()), 2, fill),
        Field::Hour12 => number(out, i64::from(hour12), 2, fill),
        Field::Minute => number(out, i64::from(t.minute()), 2, fill),
        Field::Second => number(out, i64::from(t.second()), 2, fill),
        Field::Millis => number(out, micros / 1000, 3, fill),
        Field::Micros => number(out, micros, 6, fill),
        Field::Fraction(n) => {
            let digits = micros / 10_i64.pow(6 - u32::from(n));
            number(out, digits, usize::from(n), fill)
        }
        Field::SecondsOfDay => number(out, i64::from(t.num_seconds_from_midnight()), 0, true),
        Field::Meridiem { upper, dots } => {
            let first = if t.hour() < 12 { 'a' } else { 'p' };
            meridiem(out, upper, dots, first)
        }
        Field::Era { upper, dots } => {
            let (first, second) = if year <= 0 { ('b', 'c') } else { ('a', 'd') };
            let text = if dots {
                format!("{first}.{second}.")
            } else {
                format!("{first}{second}")
            };
            out.push_str(&if upper { text.to_uppercase() } else { text });
        }
        Field::YearComma => {
            let s = format!("{:04}", shown_year);
            let (thousands, rest) = s.split_at(s.len() - 3);
            out.push_str(&format!("{thousands},{rest}"));
        }
        Field::Year(4) => number(out, shown_year, 4, fill),
        // PostgreSQL prints the last digits with their zeros, FM or not.
        Field::Year(n) => {
            let modulus = 10_i64.pow(u32::from(n));
            number(out, shown_year % modulus, usize::from(n), false)
        }
        Field::IsoYear(n) => {
            let iso = i64::from(t.iso_week().year());
            if n == 4 {
                number(out, iso, 4, fill)
            } else {
                number(out, iso % 10_i64.pow(u32::from(n)), usize::from(n), false)
            }
        }
        Field::MonthName { case, short } => {
            name(out, MONTHS[t.month0() as usize], case, short, fill)
        }
        Field::DayName { case, short } => {
            let day = t.weekday().num_days_from_sunday() as usize;
            name(out, DAYS[day], case, short, fill)
        }
        Field::RomanMonth { upper } => {
            let roman = ROMAN[t.month0() as usize];
            let roman = if upper {
                roman.to_string()
            } else {
                roman.to_lowercase()
            };
            if fill {
                out.push_str(&roman)
            } else {
                out.push_str(&format!("{roman:<4}"))
            }
        }
        Field::Month => number(out, i64::from(t.month()), 2, fill),
        Field::DayOfYear => number(out, i64::from(t.ordinal()), 3, fill),
        Field::IsoDayOfYear => {
            let week = i64::from(t.iso_week().week());
            let day = i64::from(t.weekday().number_from_monday());
            number(out, (week - 1) * 7 + day, 3, fill)
        }
        Field::DayOfMonth => number(out, i64::from(t.day()), 2, fill),
        Field::DayOfWeek => number(out, i64::from(t.weekday().number_from_sunday()), 1, fill),
        Field::IsoDayOfWeek => number(out, i64::from(t.weekday().number_from_monday()), 1, fill),
        Field::WeekOfMonth => number(out, i64::from((t.day() - 1) / 7 + 1), 1, fill),
        Field::WeekOfYear => number(out, i64::from((t.ordinal() - 1) / 7 + 1), 2, fill),
        Field::IsoWeek => number(out, i64::from(t.iso_week().week()), 2, fill),
        Field::Quarter => number(out, i64::from(t.month0() / 3 + 1), 1, fill),
        Field::Century => {
            let century = if year > 0 {
                (year + 99) / 100
            } else {
                -((shown_year + 99) / 100)
            };
            number(out, century, 2, fill)
        }
        Field::Julian => {
            let days = i64::from(t.date().num_days_from_ce());
            number(out, days + JULIAN_OF_CE, 0, true)
        }
        // A timestamp without time zone has no zone name but an offset of zero, as in
        // PostgreSQL; a timestamptz is shown in UTC.
        Field::Zone { upper } => {
            if zoned {
                out.push_str(if upper { "UTC" } else { "utc" })
            }
        }
        Field::Offset | Field::OffsetHours => out.push_str("+00"),
        Field::OffsetMinutes => out.push_str("00"),
    }
}

/// `to_char` as PostgreSQL has it for timestamps and dates.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ToChar {
    signature: Signature,
}

impl ToChar {
    pub fn new() -> ToChar {
        ToChar {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

fn refused(message: String) -> DataFusionError {
    DataFusionError::External(Box::new(Error::new(ErrorKind::NotSupported, message)))
}

impl ScalarUDFImpl for ToChar {
    fn name(&self) -> &str {
        "to_char"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        match args {
            [DataType::Timestamp(..) | DataType::Date32 | DataType::Date64 | DataType::Null, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null] => {
                Ok(DataType::Utf8)
            }
            [value, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null] => {
                Err(refused(format!(
                    "to_char of {value} is not supported: only timestamps and dates"
                )))
            }
            _ => Err(DataFusionError::Plan(
                "to_char takes a timestamp or a date and a text template".into(),
            )),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let zoned = matches!(args.args[0].data_type(), DataType::Timestamp(_, Some(_)));
        let values = args.args[0].to_array(rows)?;
        let values = cast(
            &values,
            &DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
        )?;
        let values = values.as_primitive::<TimestampMicrosecondType>();
        let templates = args.args[1].to_array(rows)?;
        let templates = cast(&templates, &DataType::Utf8)?;
        let templates = templates.as_string::<i32>();
        let mut out = StringBuilder::with_capacity(rows, rows * 16);
        let mut parsed: Option<(String, Vec<Piece>)> = None;
        let mut text = String::new();
        for i in 0..rows {
            if values.is_null(i) || templates.is_null(i) {
                out.append_null();
                continue;
            }
            let template = templates.value(i);
            if parsed.as_ref().is_none_or(|(t, _)| t != template) {
                parsed = Some((template.to_string(), parse(template)));
            }
            let Some(time) = DateTime::from_timestamp_micros(values.value(i)) else {
                return Err(DataFusionError::External(Box::new(Error::new(
                    ErrorKind::DatetimeFieldOverflow,
                    "timestamp out of range",
                ))));
            };
            text.clear();
            if let Some((_, pieces)) = &parsed {
                format(pieces, &time.naive_utc(), zoned, &mut text);
            }
            out.append_value(&text);
        }
        let array: ArrayRef = Arc::new(out.finish());
        Ok(match (&args.args[0], &args.args[1]) {
            (ColumnarValue::Scalar(_), ColumnarValue::Scalar(_)) => {
                ColumnarValue::Scalar(ScalarValue::try_from_array(&array, 0)?)
            }
            _ => ColumnarValue::Array(array),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(template: &str, at: &str) -> String {
        let t = NaiveDateTime::parse_from_str(at, "%Y-%m-%d %H:%M:%S%.f").expect("a time");
        let mut out = String::new();
        format(&parse(template), &t, false, &mut out);
        out
    }

    /// Each expectation is PostgreSQL 15's `to_char(timestamp '...', '...')`.
    #[test]
    fn templates_print_as_postgres_prints_them() {
        let at = "2015-07-05 13:04:09.012345";
        for (template, expected) in [
            ("YYYY-MM-DD", "2015-07-05"),
            ("HH:MI", "01:04"),
            ("HH24:MI:SS.MS", "13:04:09.012"),
            ("HH12 AM a.m.", "01 PM p.m."),
            ("US FF1 FF3", "012345 0 012"),
            ("Month|Mon|MONTH|month", "July     |Jul|JULY     |july     "),
            ("FMMonth FMDD", "July 5"),
            ("Day Dy day DY", "Sunday    Sun sunday    SUN"),
            ("DDth DDTH FMDDth", "05th 05TH 5th"),
            ("D ID DDD IDDD", "1 7 186 189"),
            ("W WW IW Q CC J", "1 27 27 3 21 2457209"),
            ("Y,YYY YYY YY Y IYYY", "2,015 015 15 5 2015"),
            ("RM rm", "VII  vii "),
            ("SSSS", "47049"),
            ("\"YYYY is\" YYYY", "YYYY is 2015"),
            ("%Y-%m", "%5-%m"),
            ("AD B.C.", "AD A.D."),
            ("TZ OF", " +00"),
            ("FMHH12:MI", "1:04"),
        ] {
            assert_eq!(show(template, at), expected, "{template}");
        }
        assert_eq!(show("HH12 AM", "2015-07-05 00:30:00"), "12 AM");
        assert_eq!(show("DDth", "2015-07-22 00:00:00"), "22nd");
        assert_eq!(show("DDth", "2015-07-12 00:00:00"), "12th");
    }
}
