//! Types between PostgreSQL and SQLite: which PostgreSQL type a result column announces, how
//! each SQLite value is encoded as that type, and how bound parameters become SQLite values.
//!
//! SQLite columns have a declared type at most, and any column may hold any storage class,
//! so the gateway picks one type per column and then converts every value to it: an
//! integer in a `TEXT` column is sent as its decimal string, an integer in a `FLOAT8`
//! column as a float, and a value that has no form in the announced type (text that is not
//! a number in an `INT8` column) is an error (SQLSTATE 22P02) rather than a wrong answer.

use crate::GwError;
use pgwire::api::portal::Format;
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo};
use pgwire::api::Type;
use pgwire::messages::data::DataRow;
use redoubt_services::sql::{Column, Value};
use std::sync::Arc;

/// The PostgreSQL type for a column declared `decl`, after SQLite's affinity rules (a
/// declared type containing `INT` is an integer...), with `BOOL` added.
pub fn type_of_decl(decl: &str) -> Type {
    let d = decl.to_ascii_uppercase();
    if d.contains("INT") {
        Type::INT8
    } else if d.contains("CHAR") || d.contains("CLOB") || d.contains("TEXT") {
        Type::TEXT
    } else if d.contains("BLOB") || d.contains("BYTEA") {
        Type::BYTEA
    } else if d.contains("REAL") || d.contains("FLOA") || d.contains("DOUB") {
        Type::FLOAT8
    } else if d.contains("BOOL") {
        Type::BOOL
    } else {
        Type::TEXT
    }
}

/// The types a statement's columns announce before it runs: the declared type's, else
/// `TEXT` (an expression's type is not known until there is a value).
pub fn described_types(columns: &[Column]) -> Vec<Type> {
    columns
        .iter()
        .map(|c| c.decl_type.as_deref().map_or(Type::TEXT, type_of_decl))
        .collect()
}

/// The types a result's columns announce when the rows are at hand (the simple query
/// protocol, and a portal described before it runs): the declared type's, else one that
/// holds every value of the column: `int8` when all are integers, `float8` when all are
/// numbers, `bytea` when all are blobs, else (and with no values) `text`.
pub fn inferred_types(columns: &[Column], rows: &[Vec<Value>]) -> Vec<Type> {
    columns
        .iter()
        .enumerate()
        .map(|(i, c)| match &c.decl_type {
            Some(d) => type_of_decl(d),
            None => {
                let (mut ints, mut reals, mut blobs, mut texts) = (0, 0, 0, 0);
                for v in rows.iter().filter_map(|r| r.get(i)) {
                    match v {
                        Value::Null => {}
                        Value::Integer(_) => ints += 1,
                        Value::Real(_) => reals += 1,
                        Value::Blob(_) => blobs += 1,
                        Value::Text(_) => texts += 1,
                    }
                }
                match (ints, reals, blobs, texts) {
                    (1.., 0, 0, 0) => Type::INT8,
                    (_, 1.., 0, 0) => Type::FLOAT8,
                    (0, 0, 1.., 0) => Type::BYTEA,
                    _ => Type::TEXT,
                }
            }
        })
        .collect()
}

/// The format of column or parameter `i`; a list of codes of the wrong length (a client's
/// protocol error) reads as text rather than panicking.
pub fn format_at(format: &Format, i: usize) -> FieldFormat {
    match format {
        Format::UnifiedText => FieldFormat::Text,
        Format::UnifiedBinary => FieldFormat::Binary,
        Format::Individual(codes) => FieldFormat::from(codes.get(i).copied().unwrap_or(0)),
    }
}

/// Row description fields for `columns` announced as `types`, in `format`.
pub fn fields(columns: &[Column], types: &[Type], format: &Format) -> Vec<FieldInfo> {
    columns
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, (c, t))| {
            FieldInfo::new(c.name.clone(), None, None, t.clone(), format_at(format, i))
        })
        .collect()
}

/// A value converted to the type its column announces.
#[derive(Clone, Debug, PartialEq)]
enum Cell {
    Null,
    Int(i64),
    Float(f64),
    Bool(bool),
    Bytes(Vec<u8>),
    Text(String),
}

/// PostgreSQL's text form of a float.
pub fn float_text(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        format!("{f}")
    }
}

/// PostgreSQL's text form (`\x` and hex digits) of a byte string.
fn bytea_text(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("\\x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "t" | "true" | "y" | "yes" | "on" | "1" => Some(true),
        "f" | "false" | "n" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

fn cell(v: &Value, ty: &Type, column: &str) -> Result<Cell, GwError> {
    let bad = |what: String| {
        GwError::new(
            "22P02",
            format!(
                "column \"{column}\" is announced as {} but holds {what}",
                ty.name()
            ),
        )
    };
    Ok(match (v, ty) {
        (Value::Null, _) => Cell::Null,
        (Value::Integer(i), &Type::INT8) => Cell::Int(*i),
        (Value::Real(f), &Type::INT8) if f.fract() == 0.0 && f.abs() < 9.2e18 => {
            Cell::Int(*f as i64)
        }
        (Value::Text(s), &Type::INT8) => match s.trim().parse() {
            Ok(i) => Cell::Int(i),
            Err(_) => return Err(bad(format!("the text {s:?}, which is not an integer"))),
        },
        (Value::Integer(i), &Type::FLOAT8) => Cell::Float(*i as f64),
        (Value::Real(f), &Type::FLOAT8) => Cell::Float(*f),
        (Value::Text(s), &Type::FLOAT8) => match s.trim().parse() {
            Ok(f) => Cell::Float(f),
            Err(_) => return Err(bad(format!("the text {s:?}, which is not a number"))),
        },
        (Value::Integer(i), &Type::BOOL) => Cell::Bool(*i != 0),
        (Value::Real(f), &Type::BOOL) => Cell::Bool(*f != 0.0),
        (Value::Text(s), &Type::BOOL) => match parse_bool(s) {
            Some(b) => Cell::Bool(b),
            None => return Err(bad(format!("the text {s:?}, which is not a boolean"))),
        },
        (Value::Blob(b), &Type::BYTEA) => Cell::Bytes(b.clone()),
        (Value::Text(s), &Type::BYTEA) => Cell::Bytes(s.as_bytes().to_vec()),
        (Value::Integer(i), &Type::BYTEA) => Cell::Bytes(i.to_string().into_bytes()),
        (Value::Real(f), &Type::BYTEA) => Cell::Bytes(float_text(*f).into_bytes()),
        (Value::Real(f), &Type::INT8) => return Err(bad(format!("{f}, which is not an integer"))),
        (Value::Blob(_), &Type::INT8 | &Type::FLOAT8 | &Type::BOOL) => {
            return Err(bad("a blob".into()))
        }
        // TEXT, and any other type: the value's text.
        (Value::Integer(i), _) => Cell::Text(i.to_string()),
        (Value::Real(f), _) => Cell::Text(float_text(*f)),
        (Value::Text(s), _) => Cell::Text(s.clone()),
        (Value::Blob(b), _) => Cell::Text(bytea_text(b)),
    })
}

/// Encodes `rows` as data rows of `fields` (from [`fields`]); every value is converted to its
/// column's type first, so a value without a form in that type fails the whole result
/// before anything is sent.
pub fn encode_rows(
    fields: &Arc<Vec<FieldInfo>>,
    rows: &[Vec<Value>],
) -> Result<Vec<DataRow>, GwError> {
    let mut enc = DataRowEncoder::new(fields.clone());
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        if row.len() != fields.len() {
            return Err(GwError::new(
                "XX000",
                format!(
                    "a result row has {} values for {} columns",
                    row.len(),
                    fields.len()
                ),
            ));
        }
        for (v, f) in row.iter().zip(fields.iter()) {
            let encoded = match cell(v, f.datatype(), f.name())? {
                Cell::Null => enc.encode_field(&None::<i64>),
                Cell::Int(i) => enc.encode_field(&i),
                Cell::Float(x) => enc.encode_field(&x),
                Cell::Bool(b) => enc.encode_field(&b),
                Cell::Bytes(b) => enc.encode_field(&b.as_slice()),
                Cell::Text(s) => enc.encode_field(&s.as_str()),
            };
            encoded.map_err(|e| GwError::new("XX000", format!("cannot encode a value: {e}")))?;
        }
        out.push(enc.take_row());
    }
    Ok(out)
}

fn bad_param(i: usize, ty: &Type, what: impl std::fmt::Display) -> GwError {
    GwError::new(
        "22P02",
        format!("parameter ${} of type {}: {what}", i + 1, ty.name()),
    )
}

/// Parameter `i` (0-based) of type `ty` as a SQLite value, from its bytes in text or binary
/// format (`None`: SQL NULL).
pub fn decode_param(
    i: usize,
    ty: &Type,
    format: FieldFormat,
    bytes: Option<&[u8]>,
) -> Result<Value, GwError> {
    let Some(b) = bytes else {
        return Ok(Value::Null);
    };
    match format {
        FieldFormat::Text => decode_text(i, ty, b),
        FieldFormat::Binary => decode_binary(i, ty, b),
    }
}

fn decode_text(i: usize, ty: &Type, b: &[u8]) -> Result<Value, GwError> {
    if *ty == Type::BYTEA {
        return parse_bytea(b)
            .map(Value::Blob)
            .ok_or_else(|| bad_param(i, ty, "invalid bytea text"));
    }
    let s = std::str::from_utf8(b)
        .map_err(|_| GwError::new("22021", format!("parameter ${} is not valid UTF-8", i + 1)))?;
    match *ty {
        Type::INT2 | Type::INT4 | Type::INT8 | Type::OID => s
            .trim()
            .parse()
            .map(Value::Integer)
            .map_err(|_| bad_param(i, ty, format!("{s:?} is not an integer"))),
        Type::FLOAT4 | Type::FLOAT8 | Type::NUMERIC => s
            .trim()
            .parse()
            .map(Value::Real)
            .map_err(|_| bad_param(i, ty, format!("{s:?} is not a number"))),
        Type::BOOL => parse_bool(s)
            .map(|v| Value::Integer(v as i64))
            .ok_or_else(|| bad_param(i, ty, format!("{s:?} is not a boolean"))),
        _ => Ok(Value::Text(s.to_string())),
    }
}

/// PostgreSQL's bytea text input: `\x` and hex digits, or the escape format (`\\` and
/// `\ooo`); `None` if it is not valid.
pub(crate) fn parse_bytea(b: &[u8]) -> Option<Vec<u8>> {
    if let Some(hex) = b.strip_prefix(b"\\x") {
        let digits: Vec<u8> = hex
            .iter()
            .copied()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        if !digits.len().is_multiple_of(2) {
            return None;
        }
        let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        return digits
            .chunks(2)
            .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
            .collect();
    }
    let mut out = Vec::with_capacity(b.len());
    let mut k = 0;
    while k < b.len() {
        if b[k] != b'\\' {
            out.push(b[k]);
            k += 1;
        } else if b.get(k + 1) == Some(&b'\\') {
            out.push(b'\\');
            k += 2;
        } else {
            let s = std::str::from_utf8(b.get(k + 1..k + 4)?).ok()?;
            out.push(u8::from_str_radix(s, 8).ok()?);
            k += 4;
        }
    }
    Some(out)
}

fn decode_binary(i: usize, ty: &Type, b: &[u8]) -> Result<Value, GwError> {
    let sized = |n: usize| -> Result<&[u8], GwError> {
        if b.len() == n {
            Ok(b)
        } else {
            Err(GwError::new(
                "22P03",
                format!(
                    "parameter ${} of type {}: {} bytes in binary format, {n} expected",
                    i + 1,
                    ty.name(),
                    b.len()
                ),
            ))
        }
    };
    Ok(match *ty {
        Type::INT2 => Value::Integer(i16::from_be_bytes(sized(2)?.try_into().expect("2")) as i64),
        Type::INT4 => Value::Integer(i32::from_be_bytes(sized(4)?.try_into().expect("4")) as i64),
        Type::INT8 => Value::Integer(i64::from_be_bytes(sized(8)?.try_into().expect("8"))),
        Type::OID => Value::Integer(u32::from_be_bytes(sized(4)?.try_into().expect("4")) as i64),
        Type::FLOAT4 => Value::Real(f32::from_be_bytes(sized(4)?.try_into().expect("4")) as f64),
        Type::FLOAT8 => Value::Real(f64::from_be_bytes(sized(8)?.try_into().expect("8"))),
        Type::BOOL => Value::Integer((sized(1)?[0] != 0) as i64),
        Type::BYTEA => Value::Blob(b.to_vec()),
        Type::NUMERIC => Value::Real(
            decode_numeric(b).ok_or_else(|| bad_param(i, ty, "invalid binary numeric"))?,
        ),
        Type::DATE => Value::Text(date_text(i32::from_be_bytes(
            sized(4)?.try_into().expect("4"),
        ))),
        Type::TIMESTAMP => Value::Text(timestamp_text(
            i64::from_be_bytes(sized(8)?.try_into().expect("8")),
            "",
        )),
        // The gateway's time zone is UTC, in which the client sent the instant.
        Type::TIMESTAMPTZ => Value::Text(timestamp_text(
            i64::from_be_bytes(sized(8)?.try_into().expect("8")),
            "+00:00",
        )),
        Type::TIME => Value::Text(time_text(i64::from_be_bytes(
            sized(8)?.try_into().expect("8"),
        ))),
        Type::UUID => Value::Text(uuid_text(sized(16)?)),
        Type::JSONB if b.first() == Some(&1) => {
            Value::Text(String::from_utf8(b[1..].to_vec()).map_err(|_| {
                GwError::new("22021", format!("parameter ${} is not valid UTF-8", i + 1))
            })?)
        }
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN | Type::JSON => {
            Value::Text(String::from_utf8(b.to_vec()).map_err(|_| {
                GwError::new("22021", format!("parameter ${} is not valid UTF-8", i + 1))
            })?)
        }
        _ => {
            return Err(GwError::new(
                "0A000",
                format!(
                    "parameter ${} of type {} in binary format is not supported by the gateway; \
                     send it in text format",
                    i + 1,
                    ty.name()
                ),
            ))
        }
    })
}

/// Days since 1970-01-01 as a civil date (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + (m <= 2) as i64, m, d)
}

/// Days from 1970-01-01 to 2000-01-01, PostgreSQL's epoch.
const PG_EPOCH_DAYS: i64 = 10_957;

/// A binary date (days since 2000-01-01) in PostgreSQL's ISO text form.
fn date_text(days: i32) -> String {
    match days {
        i32::MAX => "infinity".into(),
        i32::MIN => "-infinity".into(),
        _ => {
            let (y, m, d) = civil(days as i64 + PG_EPOCH_DAYS);
            if y <= 0 {
                format!("{:04}-{m:02}-{d:02} BC", 1 - y)
            } else {
                format!("{y:04}-{m:02}-{d:02}")
            }
        }
    }
}

/// Microseconds since midnight as `HH:MM:SS[.ffffff]` (trailing zeros dropped).
fn time_text(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let frac = us.rem_euclid(1_000_000);
    let mut s = format!(
        "{:02}:{:02}:{:02}",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    );
    if frac != 0 {
        let f = format!("{frac:06}");
        s.push('.');
        s.push_str(f.trim_end_matches('0'));
    }
    s
}

/// A binary timestamp (microseconds since 2000-01-01 00:00) in PostgreSQL's ISO text form,
/// `zone` appended.
fn timestamp_text(us: i64, zone: &str) -> String {
    match us {
        i64::MAX => "infinity".into(),
        i64::MIN => "-infinity".into(),
        _ => {
            let days = us.div_euclid(86_400_000_000);
            let (y, m, d) = civil(days + PG_EPOCH_DAYS);
            let time = time_text(us.rem_euclid(86_400_000_000));
            let date = if y <= 0 {
                format!("{:04}-{m:02}-{d:02}", 1 - y)
            } else {
                format!("{y:04}-{m:02}-{d:02}")
            };
            let era = if y <= 0 { " BC" } else { "" };
            format!("{date} {time}{zone}{era}")
        }
    }
}

/// 16 bytes as a UUID's hyphenated lower-case text.
fn uuid_text(b: &[u8]) -> String {
    let mut s = String::with_capacity(36);
    for (k, x) in b.iter().enumerate() {
        if matches!(k, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// PostgreSQL's binary numeric: digit count, weight, sign, display scale, then base-10000
/// digits.
fn decode_numeric(b: &[u8]) -> Option<f64> {
    let word =
        |k: usize| -> Option<u16> { Some(u16::from_be_bytes(b.get(k..k + 2)?.try_into().ok()?)) };
    let ndigits = word(0)? as usize;
    let weight = word(2)? as i16 as i32;
    let sign = word(4)?;
    match sign {
        0xC000 => return Some(f64::NAN),
        0xD000 => return Some(f64::INFINITY),
        0xF000 => return Some(f64::NEG_INFINITY),
        0x0000 | 0x4000 => {}
        _ => return None,
    }
    if b.len() != 8 + 2 * ndigits {
        return None;
    }
    let mut v = 0f64;
    for k in 0..ndigits {
        let d = word(8 + 2 * k)?;
        if d >= 10000 {
            return None;
        }
        v += d as f64 * 10000f64.powi(weight - k as i32);
    }
    Some(if sign == 0x4000 { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, decl: Option<&str>) -> Column {
        Column {
            name: name.into(),
            decl_type: decl.map(Into::into),
        }
    }

    #[test]
    fn declared_types_follow_sqlite_affinity() {
        assert_eq!(type_of_decl("INTEGER"), Type::INT8);
        assert_eq!(type_of_decl("bigint"), Type::INT8);
        assert_eq!(type_of_decl("VARCHAR(20)"), Type::TEXT);
        assert_eq!(type_of_decl("clob"), Type::TEXT);
        assert_eq!(type_of_decl("BLOB"), Type::BYTEA);
        assert_eq!(type_of_decl("BYTEA"), Type::BYTEA);
        assert_eq!(type_of_decl("DOUBLE PRECISION"), Type::FLOAT8);
        assert_eq!(type_of_decl("float"), Type::FLOAT8);
        assert_eq!(type_of_decl("REAL"), Type::FLOAT8);
        assert_eq!(type_of_decl("BOOLEAN"), Type::BOOL);
        assert_eq!(type_of_decl("NUMERIC(10,2)"), Type::TEXT);
        assert_eq!(type_of_decl("DATE"), Type::TEXT);
    }

    #[test]
    fn undeclared_columns_are_text_when_described_and_inferred_from_values() {
        let cols = vec![
            col("a", None),
            col("b", None),
            col("c", Some("INT")),
            col("d", None),
        ];
        assert_eq!(
            described_types(&cols),
            vec![Type::TEXT, Type::TEXT, Type::INT8, Type::TEXT]
        );
        let rows = vec![
            vec![
                Value::Null,
                Value::Real(1.5),
                Value::Text("7".into()),
                Value::Null,
            ],
            vec![
                Value::Integer(3),
                Value::Null,
                Value::Integer(8),
                Value::Blob(vec![1]),
            ],
        ];
        assert_eq!(
            inferred_types(&cols, &rows),
            vec![Type::INT8, Type::FLOAT8, Type::INT8, Type::BYTEA]
        );
        assert_eq!(inferred_types(&cols[..1], &[]), vec![Type::TEXT]);
    }

    #[test]
    fn values_convert_to_the_announced_type() {
        assert_eq!(
            cell(&Value::Integer(5), &Type::TEXT, "c").unwrap(),
            Cell::Text("5".into())
        );
        assert_eq!(
            cell(&Value::Integer(5), &Type::FLOAT8, "c").unwrap(),
            Cell::Float(5.0)
        );
        assert_eq!(
            cell(&Value::Real(2.0), &Type::INT8, "c").unwrap(),
            Cell::Int(2)
        );
        assert_eq!(
            cell(&Value::Text(" 42 ".into()), &Type::INT8, "c").unwrap(),
            Cell::Int(42)
        );
        assert_eq!(
            cell(&Value::Integer(0), &Type::BOOL, "c").unwrap(),
            Cell::Bool(false)
        );
        assert_eq!(
            cell(&Value::Blob(vec![0xde, 0xad]), &Type::TEXT, "c").unwrap(),
            Cell::Text("\\xdead".into())
        );
        assert_eq!(
            cell(&Value::Real(f64::INFINITY), &Type::TEXT, "c").unwrap(),
            Cell::Text("Infinity".into())
        );
        assert_eq!(cell(&Value::Null, &Type::INT8, "c").unwrap(), Cell::Null);
        let e = cell(&Value::Text("abc".into()), &Type::INT8, "qty").unwrap_err();
        assert_eq!(e.code, "22P02");
        assert!(e.message.contains("qty"), "{}", e.message);
        assert_eq!(
            cell(&Value::Real(1.5), &Type::INT8, "c").unwrap_err().code,
            "22P02"
        );
        assert_eq!(
            cell(&Value::Blob(vec![]), &Type::FLOAT8, "c")
                .unwrap_err()
                .code,
            "22P02"
        );
    }

    #[test]
    fn rows_encode_in_text_and_binary() {
        let cols = vec![col("n", Some("INT")), col("s", None)];
        let types = described_types(&cols);
        let text = Arc::new(fields(&cols, &types, &Format::UnifiedText));
        let rows = vec![
            vec![Value::Integer(7), Value::Integer(9)],
            vec![Value::Null, Value::Text("x".into())],
        ];
        let out = encode_rows(&text, &rows).unwrap();
        assert_eq!(out.len(), 2);
        // 7 as text, then 9 as text (the column is TEXT): length-prefixed fields.
        assert_eq!(&out[0].data[..], b"\0\0\0\x017\0\0\0\x019");
        // NULL is length -1.
        assert_eq!(&out[1].data[..], b"\xff\xff\xff\xff\0\0\0\x01x");
        let binary = Arc::new(fields(&cols, &types, &Format::UnifiedBinary));
        let out = encode_rows(&binary, &rows[..1]).unwrap();
        assert_eq!(&out[0].data[..], b"\0\0\0\x08\0\0\0\0\0\0\0\x07\0\0\0\x019");
        let bad = vec![vec![Value::Text("seven".into()), Value::Null]];
        assert_eq!(encode_rows(&text, &bad).unwrap_err().code, "22P02");
    }

    #[test]
    fn parameters_decode_from_text() {
        let t = FieldFormat::Text;
        assert_eq!(
            decode_param(0, &Type::INT4, t, Some(b"-12")).unwrap(),
            Value::Integer(-12)
        );
        assert_eq!(
            decode_param(0, &Type::FLOAT8, t, Some(b"2.5")).unwrap(),
            Value::Real(2.5)
        );
        assert_eq!(
            decode_param(0, &Type::NUMERIC, t, Some(b"10.25")).unwrap(),
            Value::Real(10.25)
        );
        assert_eq!(
            decode_param(0, &Type::BOOL, t, Some(b"t")).unwrap(),
            Value::Integer(1)
        );
        assert_eq!(
            decode_param(0, &Type::BOOL, t, Some(b"off")).unwrap(),
            Value::Integer(0)
        );
        assert_eq!(
            decode_param(0, &Type::TEXT, t, Some(b"hi")).unwrap(),
            Value::Text("hi".into())
        );
        assert_eq!(
            decode_param(0, &Type::UNKNOWN, t, Some(b"5")).unwrap(),
            Value::Text("5".into())
        );
        assert_eq!(
            decode_param(0, &Type::BYTEA, t, Some(b"\\x00ff")).unwrap(),
            Value::Blob(vec![0, 255])
        );
        assert_eq!(
            decode_param(0, &Type::BYTEA, t, Some(b"a\\\\b\\001")).unwrap(),
            Value::Blob(vec![b'a', b'\\', b'b', 1])
        );
        assert_eq!(decode_param(0, &Type::INT8, t, None).unwrap(), Value::Null);
        let e = decode_param(1, &Type::INT8, t, Some(b"x")).unwrap_err();
        assert_eq!(e.code, "22P02");
        assert!(e.message.contains("$2"), "{}", e.message);
    }

    #[test]
    fn parameters_decode_from_binary() {
        let b = FieldFormat::Binary;
        assert_eq!(
            decode_param(0, &Type::INT2, b, Some(&(-3i16).to_be_bytes())).unwrap(),
            Value::Integer(-3)
        );
        assert_eq!(
            decode_param(0, &Type::INT4, b, Some(&70000i32.to_be_bytes())).unwrap(),
            Value::Integer(70000)
        );
        assert_eq!(
            decode_param(0, &Type::INT8, b, Some(&(1i64 << 40).to_be_bytes())).unwrap(),
            Value::Integer(1 << 40)
        );
        assert_eq!(
            decode_param(0, &Type::FLOAT4, b, Some(&1.5f32.to_be_bytes())).unwrap(),
            Value::Real(1.5)
        );
        assert_eq!(
            decode_param(0, &Type::FLOAT8, b, Some(&(-0.25f64).to_be_bytes())).unwrap(),
            Value::Real(-0.25)
        );
        assert_eq!(
            decode_param(0, &Type::BOOL, b, Some(&[1])).unwrap(),
            Value::Integer(1)
        );
        assert_eq!(
            decode_param(0, &Type::BYTEA, b, Some(&[9, 8])).unwrap(),
            Value::Blob(vec![9, 8])
        );
        assert_eq!(
            decode_param(0, &Type::VARCHAR, b, Some(b"v")).unwrap(),
            Value::Text("v".into())
        );
        // 12345.67: digits 1, 2345, 6700; weight 1; dscale 2.
        let num = [0, 3, 0, 1, 0, 0, 0, 2, 0, 1, 0x09, 0x29, 0x1a, 0x2c];
        assert_eq!(
            decode_param(0, &Type::NUMERIC, b, Some(&num)).unwrap(),
            Value::Real(12345.67)
        );
        assert_eq!(
            decode_param(0, &Type::INT8, b, Some(&[0; 4]))
                .unwrap_err()
                .code,
            "22P03"
        );
        assert_eq!(
            decode_param(0, &Type::INTERVAL, b, Some(&[0; 16]))
                .unwrap_err()
                .code,
            "0A000"
        );
    }

    #[test]
    fn dates_times_and_uuids_decode_from_binary_to_iso_text() {
        let b = FieldFormat::Binary;
        let text = |ty: &Type, bytes: &[u8]| match decode_param(0, ty, b, Some(bytes)).unwrap() {
            Value::Text(s) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(text(&Type::DATE, &0i32.to_be_bytes()), "2000-01-01");
        // 2024-02-29 is 8825 days after 2000-01-01.
        assert_eq!(text(&Type::DATE, &8825i32.to_be_bytes()), "2024-02-29");
        assert_eq!(text(&Type::DATE, &(-1i32).to_be_bytes()), "1999-12-31");
        let us = (8825i64 * 86_400 + 12 * 3600 + 30 * 60 + 5) * 1_000_000 + 250_000;
        assert_eq!(
            text(&Type::TIMESTAMP, &us.to_be_bytes()),
            "2024-02-29 12:30:05.25"
        );
        assert_eq!(
            text(&Type::TIMESTAMPTZ, &(us - 250_000).to_be_bytes()),
            "2024-02-29 12:30:05+00:00"
        );
        assert_eq!(
            text(&Type::TIME, &(3_723_000_001i64).to_be_bytes()),
            "01:02:03.000001"
        );
        assert_eq!(text(&Type::TIMESTAMP, &i64::MAX.to_be_bytes()), "infinity");
        let id: Vec<u8> = (0u8..16).collect();
        assert_eq!(
            text(&Type::UUID, &id),
            "00010203-0405-0607-0809-0a0b0c0d0e0f"
        );
        assert_eq!(text(&Type::JSONB, b"\x01{}"), "{}");
        assert_eq!(
            decode_param(0, &Type::DATE, b, Some(&[0; 3]))
                .unwrap_err()
                .code,
            "22P03"
        );
    }

    #[test]
    fn mixed_columns_announce_a_type_that_holds_every_value() {
        let cols = vec![col("a", None), col("b", None), col("c", None)];
        let rows = vec![
            vec![Value::Integer(1), Value::Integer(1), Value::Integer(1)],
            vec![Value::Integer(2), Value::Real(1.5), Value::Text("x".into())],
        ];
        assert_eq!(
            inferred_types(&cols, &rows),
            vec![Type::INT8, Type::FLOAT8, Type::TEXT]
        );
    }
}
