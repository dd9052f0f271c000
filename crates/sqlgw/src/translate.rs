//! PostgreSQL syntax that drivers send, rewritten into SQLite's dialect before a statement
//! reaches the service.
//!
//! - `expr::type` casts: to `CAST(expr AS INTEGER | REAL | NUMERIC | TEXT | BLOB)` for
//!   numbers, text and `bytea`; literals of those types and of `bool` are checked and
//!   written as SQLite literals (`'abc'::int` is SQLSTATE 22P02, as in PostgreSQL);
//!   date, time, timestamp, uuid and json casts keep the value as text (a timestamp
//!   literal's `T` becomes a space, PostgreSQL's text form). Arrays, `interval` and any
//!   other type are refused (0A000) rather than passed on to give a different answer.
//! - `E'...'` strings: their backslash escapes resolved into an ordinary literal.
//! - `ILIKE` / `NOT ILIKE`: SQLite's `LIKE`, which ignores ASCII case.
//! - `now()`, `transaction_timestamp()`, `statement_timestamp()`: the operation's agreed
//!   time (SQLite's `'now'` in the service); `version()`, `current_schema()`,
//!   `current_database()`: constants.
//! - `SERIAL` / `BIGSERIAL` / `SMALLSERIAL` columns in `CREATE TABLE`: `INTEGER` when the
//!   column is the table's only primary key (SQLite then assigns its ids), else refused.
//!
//! Quoted text, quoted identifiers and comments are copied as they are.

use crate::GwError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Space,
    /// `'...'` (start..end includes the quotes).
    Str,
    /// `E'...'` or `e'...'`.
    EStr,
    /// `"..."` or `` `...` ``.
    QIdent,
    /// `[...]`.
    Bracket,
    Word,
    Num,
    Param,
    DoubleColon,
    Open,
    Close,
    Dot,
    Other,
    /// An expression the gateway wrote (a rewritten cast or function).
    Expr,
}

#[derive(Clone, Copy, Debug)]
struct Tok {
    kind: Kind,
    start: usize,
    end: usize,
}

fn tokens(sql: &str) -> Vec<Tok> {
    let b = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let quoted = |mut i: usize, close: u8, backslash: bool| -> usize {
        while i < b.len() {
            if backslash && b[i] == b'\\' {
                i += 2;
                continue;
            }
            if b[i] == close {
                if close != b']' && b.get(i + 1) == Some(&close) {
                    i += 2;
                    continue;
                }
                return i + 1;
            }
            i += 1;
        }
        b.len()
    };
    while i < b.len() {
        let start = i;
        let c = b[i];
        let kind = match c {
            b'\'' => {
                i = quoted(i + 1, b'\'', false);
                Kind::Str
            }
            b'"' | b'`' => {
                i = quoted(i + 1, c, false);
                Kind::QIdent
            }
            b'[' => {
                i = quoted(i + 1, b']', false);
                Kind::Bracket
            }
            b'e' | b'E' if b.get(i + 1) == Some(&b'\'') => {
                i = quoted(i + 2, b'\'', true);
                Kind::EStr
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                Kind::Space
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i = (i + 2).min(b.len());
                Kind::Space
            }
            b':' if b.get(i + 1) == Some(&b':') => {
                i += 2;
                Kind::DoubleColon
            }
            b'$' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                i += 1;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                Kind::Param
            }
            b'(' => {
                i += 1;
                Kind::Open
            }
            b')' => {
                i += 1;
                Kind::Close
            }
            b'.' if !b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                i += 1;
                Kind::Dot
            }
            _ if c.is_ascii_whitespace() => {
                while i < b.len() && b[i].is_ascii_whitespace() {
                    i += 1;
                }
                Kind::Space
            }
            _ if c.is_ascii_digit() || c == b'.' => {
                while i < b.len()
                    && (b[i].is_ascii_alphanumeric()
                        || b[i] == b'.'
                        || ((b[i] == b'+' || b[i] == b'-')
                            && matches!(b[i - 1], b'e' | b'E')
                            && !sql[start..i].starts_with("0x")))
                {
                    i += 1;
                }
                Kind::Num
            }
            _ if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] >= 0x80)
                {
                    i += 1;
                }
                Kind::Word
            }
            _ => {
                // One character (UTF-8 aware: non-ASCII starts a word above).
                i += 1;
                Kind::Other
            }
        };
        out.push(Tok {
            kind,
            start,
            end: i.min(b.len()),
        });
    }
    out
}

/// A piece of the rewritten statement.
#[derive(Clone, Debug)]
struct Piece {
    kind: Kind,
    text: String,
}

fn syntax(msg: impl Into<String>) -> GwError {
    GwError::new("42601", msg)
}

fn unsupported(msg: impl Into<String>) -> GwError {
    GwError::new("0A000", msg)
}

/// The value of a `'...'` literal (quotes removed, doubled quotes undone).
fn str_value(lit: &str) -> String {
    let inner = lit.strip_prefix('\'').unwrap_or(lit);
    let inner = inner.strip_suffix('\'').unwrap_or(inner);
    inner.replace("''", "'")
}

/// An SQLite string literal for `s`.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The value of an `E'...'` literal: backslash escapes resolved.
fn estr_value(lit: &str) -> Result<String, GwError> {
    let inner = &lit[2..lit.len().saturating_sub(1).max(2)];
    let b = inner.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut k = 0;
    while k < b.len() {
        let c = b[k];
        if c == b'\'' && b.get(k + 1) == Some(&b'\'') {
            out.push(b'\'');
            k += 2;
            continue;
        }
        if c != b'\\' || k + 1 >= b.len() {
            out.push(c);
            k += 1;
            continue;
        }
        let e = b[k + 1];
        k += 2;
        match e {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'x' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 && k < b.len() && b[k].is_ascii_hexdigit() {
                    v = v * 16 + (b[k] as char).to_digit(16).expect("hex");
                    k += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                let mut n = 1;
                while n < 3 && k < b.len() && (b'0'..=b'7').contains(&b[k]) {
                    v = v * 8 + (b[k] - b'0') as u32;
                    k += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            b'u' | b'U' => {
                return Err(unsupported(
                    "\\u and \\U escapes in E'...' strings are not supported by the gateway",
                ))
            }
            other => out.push(other),
        }
    }
    String::from_utf8(out).map_err(|_| GwError::new("22021", "an E'...' string is not valid UTF-8"))
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "t" | "true" | "y" | "yes" | "on" | "1" => Some(true),
        "f" | "false" | "n" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// What a cast becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Integer,
    Real,
    Numeric,
    Text,
    Bool,
    Blob,
    /// Kept as it is (text): date, time, uuid, json...
    Keep,
    /// A timestamp: kept as text, a literal's `T` separator becoming a space.
    Timestamp,
}

fn target_of(name: &str) -> Option<Target> {
    Some(match name {
        "int" | "integer" | "int2" | "int4" | "int8" | "bigint" | "smallint" | "oid" => {
            Target::Integer
        }
        "float" | "float4" | "float8" | "real" | "double precision" => Target::Real,
        "numeric" | "decimal" => Target::Numeric,
        "text" | "varchar" | "char" | "character" | "character varying" | "bpchar" | "name"
        | "citext" => Target::Text,
        "bool" | "boolean" => Target::Bool,
        "bytea" => Target::Blob,
        "date"
        | "time"
        | "timetz"
        | "time without time zone"
        | "time with time zone"
        | "uuid"
        | "json"
        | "jsonb"
        | "unknown" => Target::Keep,
        "timestamp"
        | "timestamptz"
        | "timestamp without time zone"
        | "timestamp with time zone" => Target::Timestamp,
        _ => return None,
    })
}

/// Rewrites one statement (see the module documentation). Returns it unchanged when it has
/// nothing to rewrite.
pub fn translate(sql: &str) -> Result<String, GwError> {
    let toks = tokens(sql);
    let text = |t: &Tok| &sql[t.start..t.end];
    let word_is = |t: Option<&Tok>, w: &str| {
        t.is_some_and(|t| t.kind == Kind::Word && text(t).eq_ignore_ascii_case(w))
    };
    let create_table = {
        let words: Vec<&Tok> = toks
            .iter()
            .filter(|t| t.kind != Kind::Space)
            .take(4)
            .collect();
        word_is(words.first().copied(), "CREATE")
            && words
                .iter()
                .skip(1)
                .take(2)
                .any(|t| word_is(Some(t), "TABLE"))
    };
    let mut out: Vec<Piece> = Vec::with_capacity(toks.len());
    let mut k = 0;
    // The next token that is not whitespace, from index j.
    let next_solid =
        |j: usize| -> Option<usize> { (j..toks.len()).find(|&x| toks[x].kind != Kind::Space) };
    while k < toks.len() {
        let t = toks[k];
        let s = text(&t);
        k += 1;
        match t.kind {
            Kind::EStr => {
                let v = estr_value(s)?;
                out.push(Piece {
                    kind: Kind::Str,
                    text: quote(&v),
                });
            }
            Kind::DoubleColon => {
                k = cast(sql, &toks, k, &mut out)?;
            }
            Kind::Word => {
                let lower = s.to_ascii_lowercase();
                let next = next_solid(k);
                let call_empty = next.is_some_and(|n| toks[n].kind == Kind::Open)
                    && next
                        .and_then(|n| next_solid(n + 1))
                        .is_some_and(|c| toks[c].kind == Kind::Close);
                // `pg_catalog.` before a function the gateway rewrites.
                let qualified_by_catalog = out.len() >= 2
                    && out[out.len() - 1].kind == Kind::Dot
                    && out[out.len() - 2].text.eq_ignore_ascii_case("pg_catalog");
                let constant = if call_empty {
                    match lower.as_str() {
                        "now" | "transaction_timestamp" | "statement_timestamp" => {
                            Some("strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')".to_string())
                        }
                        "version" => Some(
                            "('PostgreSQL 16.6 (redoubt SQL gateway over SQLite ' || \
                             sqlite_version() || ')')"
                                .to_string(),
                        ),
                        "current_schema" => Some("'public'".to_string()),
                        "current_database" => Some("'redoubt'".to_string()),
                        _ => None,
                    }
                } else {
                    None
                };
                if let Some(c) = constant {
                    if qualified_by_catalog {
                        out.truncate(out.len() - 2);
                    }
                    let close = next_solid(next.expect("call") + 1).expect("close");
                    k = close + 1;
                    out.push(Piece {
                        kind: Kind::Expr,
                        text: c,
                    });
                    continue;
                }
                if lower == "as" {
                    if let Some(after) = values_alias(sql, &toks, k, &mut out) {
                        k = after;
                        continue;
                    }
                }
                match lower.as_str() {
                    "ilike" => out.push(Piece {
                        kind: Kind::Word,
                        text: "LIKE".into(),
                    }),
                    "array"
                        if next.is_some_and(|n| {
                            toks[n].kind == Kind::Bracket || (toks[n].kind == Kind::Open && n == k)
                        }) =>
                    {
                        return Err(unsupported(
                            "arrays (ARRAY[...]) are not supported by the redoubt SQL \
                             gateway: SQLite has no array type",
                        ))
                    }
                    "serial" | "bigserial" | "smallserial" | "serial4" | "serial8" | "serial2"
                        if create_table =>
                    {
                        serial(sql, &toks, k - 1, &out)?;
                        out.push(Piece {
                            kind: Kind::Word,
                            text: "INTEGER".into(),
                        });
                    }
                    _ => out.push(Piece {
                        kind: Kind::Word,
                        text: s.to_string(),
                    }),
                }
            }
            kind => out.push(Piece {
                kind,
                text: s.to_string(),
            }),
        }
    }
    Ok(out.into_iter().map(|p| p.text).collect())
}

/// `(VALUES ...) AS name(a, b)`, which SQLite cannot name columns in, as
/// `(SELECT column1 AS a, column2 AS b FROM (VALUES ...)) AS name` (SQLAlchemy's bulk inserts
/// send it). `k` is the token after `AS`, `out` ends with the `(VALUES ...)`; returns the
/// token after the column list, `None` (nothing done) when this is not that form.
fn values_alias(sql: &str, toks: &[Tok], k: usize, out: &mut Vec<Piece>) -> Option<usize> {
    let text = |t: &Tok| &sql[t.start..t.end];
    let solid = |j: usize| (j..toks.len()).find(|&x| toks[x].kind != Kind::Space);
    let alias = solid(k)?;
    if !matches!(toks[alias].kind, Kind::Word | Kind::QIdent) {
        return None;
    }
    let open = solid(alias + 1)?;
    if toks[open].kind != Kind::Open {
        return None;
    }
    let mut names = Vec::new();
    let mut j = open + 1;
    loop {
        let n = solid(j)?;
        if !matches!(toks[n].kind, Kind::Word | Kind::QIdent) {
            return None;
        }
        names.push(text(&toks[n]).to_string());
        let sep = solid(n + 1)?;
        match (toks[sep].kind, text(&toks[sep])) {
            (Kind::Close, _) => {
                j = sep + 1;
                break;
            }
            (Kind::Other, ",") => j = sep + 1,
            _ => return None,
        }
    }
    // The `(VALUES ...)` before AS.
    let mut end = out.len();
    while end > 0 && out[end - 1].kind == Kind::Space {
        end -= 1;
    }
    if end == 0 || out[end - 1].kind != Kind::Close {
        return None;
    }
    let mut depth = 0;
    let mut start = end;
    loop {
        start = start.checked_sub(1)?;
        match out[start].kind {
            Kind::Close => depth += 1,
            Kind::Open => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            _ => {}
        }
    }
    let first = out[start + 1..end].iter().find(|p| p.kind != Kind::Space)?;
    if !first.text.eq_ignore_ascii_case("VALUES") {
        return None;
    }
    let inner: String = out[start..end].iter().map(|p| p.text.as_str()).collect();
    let columns: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("column{} AS {n}", i + 1))
        .collect();
    out.truncate(start);
    out.push(Piece {
        kind: Kind::Expr,
        text: format!(
            "(SELECT {} FROM {inner}) AS {}",
            columns.join(", "),
            text(&toks[alias])
        ),
    });
    Some(j)
}

/// The name of a column definition's column: the word that starts its definition (after
/// `(` or `,` at the table's top level).
fn column_of(sql: &str, toks: &[Tok], at: usize) -> Option<String> {
    let mut j = at;
    let mut name = None;
    while j > 0 {
        j -= 1;
        match toks[j].kind {
            Kind::Space => {}
            Kind::Open | Kind::Other if matches!(&sql[toks[j].start..toks[j].end], "(" | ",") => {
                return name
            }
            Kind::Word | Kind::QIdent | Kind::Bracket => {
                name = Some(
                    sql[toks[j].start..toks[j].end]
                        .trim_matches(['"', '`', '[', ']'])
                        .to_string(),
                );
            }
            _ => return None,
        }
    }
    None
}

/// Checks that the `SERIAL` column whose type is token `at` is its table's only primary key
/// (SQLite then makes it the row id, which it assigns as PostgreSQL's sequence would).
fn serial(sql: &str, toks: &[Tok], at: usize, _out: &[Piece]) -> Result<(), GwError> {
    let word = &sql[toks[at].start..toks[at].end];
    let refuse = || {
        unsupported(format!(
            "{word} is supported only for a table's single-column PRIMARY KEY (it becomes \
             SQLite's INTEGER PRIMARY KEY, whose ids SQLite assigns); SQLite has no sequences \
             for other columns"
        ))
    };
    let column = column_of(sql, toks, at).ok_or_else(refuse)?;
    // The rest of this column's definition: up to the `,` or `)` at its depth.
    let mut depth = 0i32;
    let mut j = at + 1;
    let mut words: Vec<String> = Vec::new();
    while j < toks.len() {
        let t = &toks[j];
        let s = &sql[t.start..t.end];
        match t.kind {
            Kind::Open => depth += 1,
            Kind::Close if depth == 0 => break,
            Kind::Close => depth -= 1,
            Kind::Other if s == "," && depth == 0 => break,
            Kind::Word => words.push(s.to_ascii_uppercase()),
            _ => {}
        }
        j += 1;
    }
    if words.windows(2).any(|w| w[0] == "PRIMARY" && w[1] == "KEY") {
        return Ok(());
    }
    // A table constraint `PRIMARY KEY (column)` with that column alone.
    let solid: Vec<&Tok> = toks.iter().filter(|t| t.kind != Kind::Space).collect();
    for w in solid.windows(5) {
        let s = |i: usize| &sql[w[i].start..w[i].end];
        if s(0).eq_ignore_ascii_case("PRIMARY")
            && s(1).eq_ignore_ascii_case("KEY")
            && w[2].kind == Kind::Open
            && s(3)
                .trim_matches(['"', '`', '[', ']'])
                .eq_ignore_ascii_case(&column)
            && w[4].kind == Kind::Close
        {
            return Ok(());
        }
    }
    Err(refuse())
}

/// Rewrites the cast whose `::` ends before token `k`; `out` holds what came before (the
/// operand at its end). Returns the index of the token after the type name.
fn cast(sql: &str, toks: &[Tok], mut k: usize, out: &mut Vec<Piece>) -> Result<usize, GwError> {
    let text = |t: &Tok| &sql[t.start..t.end];
    let skip = |mut k: usize| {
        while k < toks.len() && toks[k].kind == Kind::Space {
            k += 1;
        }
        k
    };
    // The type name: `[pg_catalog.]word [word...] [(n[, m])] [[]]`.
    k = skip(k);
    let mut words: Vec<String> = Vec::new();
    // The token after the cast (spaces after the type name stay in the statement).
    let mut end = k;
    if k + 1 < toks.len()
        && text(&toks[k]).eq_ignore_ascii_case("pg_catalog")
        && toks[k + 1].kind == Kind::Dot
    {
        k += 2;
    }
    while k < toks.len() && matches!(toks[k].kind, Kind::Word | Kind::QIdent) {
        let w = text(&toks[k]).trim_matches('"').to_ascii_lowercase();
        let continues = match (words.len(), words.last().map(String::as_str)) {
            (0, _) => true,
            (_, Some("double")) => w == "precision",
            (_, Some("character")) => w == "varying",
            (1, Some("timestamp" | "time")) => w == "with" || w == "without",
            (_, Some("with" | "without")) => w == "time",
            (3, Some("time")) => w == "zone",
            _ => false,
        };
        if !continues {
            break;
        }
        words.push(w);
        end = k + 1;
        k = skip(k + 1);
    }
    if words.is_empty() {
        return Err(syntax(
            "syntax error at or near \"::\": a type name must follow",
        ));
    }
    let name = words.join(" ");
    // A length or precision: `varchar(20)`, `numeric(10, 2)`.
    if k < toks.len() && toks[k].kind == Kind::Open {
        while k < toks.len() && toks[k].kind != Kind::Close {
            k += 1;
        }
        end = (k + 1).min(toks.len());
        k = skip(end);
    }
    if k < toks.len() && toks[k].kind == Kind::Bracket {
        return Err(unsupported(format!(
            "casts to arrays ({name}[]) are not supported by the redoubt SQL gateway: SQLite \
             has no array type"
        )));
    }
    let target = target_of(&name).ok_or_else(|| {
        unsupported(format!(
            "casts to type {name} are not supported by the redoubt SQL gateway (SQLite has \
             no such type)"
        ))
    })?;
    // The operand: the pieces at the end of `out`.
    while out.last().is_some_and(|p| p.kind == Kind::Space) {
        out.pop();
    }
    let Some(last) = out.last() else {
        return Err(syntax("syntax error at or near \"::\""));
    };
    let from = match last.kind {
        Kind::Str | Kind::Num | Kind::Param | Kind::Expr => out.len() - 1,
        Kind::Word if KEYWORDS.contains(&last.text.to_ascii_uppercase().as_str()) => {
            return Err(syntax(format!(
                "syntax error at or near \"::\": {} is not a value",
                last.text
            )))
        }
        Kind::Word | Kind::QIdent | Kind::Bracket => {
            // A qualified name: `t.c`, `s.t.c`.
            let mut f = out.len() - 1;
            while f >= 2
                && out[f - 1].kind == Kind::Dot
                && matches!(out[f - 2].kind, Kind::Word | Kind::QIdent | Kind::Bracket)
            {
                f -= 2;
            }
            f
        }
        Kind::Close => {
            let mut depth = 0;
            let mut f = out.len();
            loop {
                if f == 0 {
                    return Err(syntax("syntax error at or near \"::\": unbalanced ()"));
                }
                f -= 1;
                match out[f].kind {
                    Kind::Close => depth += 1,
                    Kind::Open => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
            }
            // A function call: its name right before the `(`.
            if f > 0 && out[f - 1].kind == Kind::Word {
                f -= 1;
            }
            f
        }
        _ => return Err(syntax("syntax error at or near \"::\"")),
    };
    let operand: Vec<Piece> = out.drain(from..).collect();
    let literal =
        (operand.len() == 1 && operand[0].kind == Kind::Str).then(|| str_value(&operand[0].text));
    let expr: String = operand.iter().map(|p| p.text.as_str()).collect();
    let invalid = |v: &str| {
        GwError::new(
            "22P02",
            format!("invalid input syntax for type {name}: {v:?}"),
        )
    };
    let rewritten = match (target, &literal) {
        (Target::Integer, Some(v)) => v.trim().parse::<i64>().map_err(|_| invalid(v))?.to_string(),
        (Target::Real | Target::Numeric, Some(v)) => {
            let x: f64 = v.trim().parse().map_err(|_| invalid(v))?;
            if !x.is_finite() {
                return Err(unsupported(format!(
                    "{v:?}::{name}: SQLite has no infinite or NaN numbers"
                )));
            }
            let kw = if target == Target::Real {
                "REAL"
            } else {
                "NUMERIC"
            };
            format!("CAST({} AS {kw})", quote(v.trim()))
        }
        (Target::Bool, Some(v)) => (parse_bool(v).ok_or_else(|| invalid(v))? as i64).to_string(),
        (Target::Blob, Some(v)) => {
            let bytes = crate::types::parse_bytea(v.as_bytes()).ok_or_else(|| invalid(v))?;
            let mut s = String::from("X'");
            for b in bytes {
                s.push_str(&format!("{b:02x}"));
            }
            s.push('\'');
            s
        }
        (Target::Timestamp, Some(v)) => {
            let t = v.trim();
            let b = t.as_bytes();
            if b.len() > 10 && b[10] == b'T' && b[4] == b'-' {
                quote(&format!("{} {}", &t[..10], &t[11..]))
            } else {
                quote(t)
            }
        }
        (Target::Text | Target::Keep, Some(v)) => quote(v),
        (Target::Integer, None) => format!("CAST({expr} AS INTEGER)"),
        (Target::Real, None) => format!("CAST({expr} AS REAL)"),
        (Target::Numeric, None) => format!("CAST({expr} AS NUMERIC)"),
        (Target::Text, None) => format!("CAST({expr} AS TEXT)"),
        // A bound bool parameter is already 0 or 1; bytea already a blob; the others text.
        (Target::Bool | Target::Blob | Target::Keep | Target::Timestamp, None) => {
            if operand.len() == 1 {
                expr
            } else {
                format!("({expr})")
            }
        }
    };
    out.push(Piece {
        kind: if literal.is_some() && rewritten.starts_with('\'') {
            Kind::Str
        } else {
            Kind::Expr
        },
        text: rewritten,
    });
    Ok(end)
}

/// Words that cannot be a cast's operand.
const KEYWORDS: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "AND",
    "OR",
    "NOT",
    "IN",
    "IS",
    "AS",
    "ON",
    "BY",
    "WHEN",
    "THEN",
    "ELSE",
    "CASE",
    "VALUES",
    "SET",
    "RETURNING",
    "LIKE",
    "BETWEEN",
    "HAVING",
    "LIMIT",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn t(sql: &str) -> String {
        translate(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    fn code(sql: &str) -> &'static str {
        translate(sql).expect_err(sql).code
    }

    #[test]
    fn plain_sqlite_is_unchanged() {
        for s in [
            "SELECT a, 'x::int', \"y::z\" FROM t WHERE b = $1 -- c::int",
            "INSERT INTO t VALUES (1.5e-3, x'00ff', ?2)",
            "SELECT /* ::int */ count(*) FROM t",
        ] {
            assert_eq!(t(s), s);
        }
    }

    #[test]
    fn casts_of_parameters_and_expressions() {
        assert_eq!(t("SELECT $1::int"), "SELECT CAST($1 AS INTEGER)");
        assert_eq!(
            t("SELECT $1::integer + $2 :: bigint"),
            "SELECT CAST($1 AS INTEGER) + CAST($2 AS INTEGER)"
        );
        assert_eq!(t("SELECT 1::int"), "SELECT CAST(1 AS INTEGER)");
        assert_eq!(t("SELECT 2::float8"), "SELECT CAST(2 AS REAL)");
        assert_eq!(t("SELECT a::text FROM t"), "SELECT CAST(a AS TEXT) FROM t");
        assert_eq!(
            t("SELECT t.a::double precision FROM t"),
            "SELECT CAST(t.a AS REAL) FROM t"
        );
        assert_eq!(
            t("SELECT count(*)::int, (a+1)::numeric(10,2) FROM t"),
            "SELECT CAST(count(*) AS INTEGER), CAST((a+1) AS NUMERIC) FROM t"
        );
        assert_eq!(t("SELECT $1::varchar(20)"), "SELECT CAST($1 AS TEXT)");
        assert_eq!(
            t("SELECT $1::pg_catalog.int4"),
            "SELECT CAST($1 AS INTEGER)"
        );
        assert_eq!(t("SELECT $1::uuid, $2::jsonb"), "SELECT $1, $2");
        assert_eq!(t("SELECT '1'::text::int"), "SELECT 1");
        assert_eq!(
            t("SELECT a::text::int"),
            "SELECT CAST(CAST(a AS TEXT) AS INTEGER)"
        );
    }

    #[test]
    fn casts_of_literals_psycopg2_inlines() {
        assert_eq!(
            t("INSERT INTO t VALUES ('2024-03-01T12:30:00.5'::timestamp)"),
            "INSERT INTO t VALUES ('2024-03-01 12:30:00.5')"
        );
        assert_eq!(
            t("SELECT '2024-03-01T12:30:00+00:00'::timestamptz"),
            "SELECT '2024-03-01 12:30:00+00:00'"
        );
        assert_eq!(t("SELECT '2024-03-01'::date"), "SELECT '2024-03-01'");
        assert_eq!(
            t("SELECT 'timestamp with time zone'::timestamp with time zone"),
            "SELECT 'timestamp with time zone'"
        );
        assert_eq!(t("SELECT '12:30:00'::time"), "SELECT '12:30:00'");
        assert_eq!(
            t("SELECT '4f1b2c3d-0000-4000-8000-000000000001'::uuid"),
            "SELECT '4f1b2c3d-0000-4000-8000-000000000001'"
        );
        assert_eq!(t("SELECT '\\x00ff10'::bytea"), "SELECT X'00ff10'");
        assert_eq!(t("SELECT E'\\\\x00ff'::bytea"), "SELECT X'00ff'");
        assert_eq!(t("SELECT 'it''s'::text"), "SELECT 'it''s'");
        assert_eq!(t("SELECT '42'::int"), "SELECT 42");
        assert_eq!(t("SELECT 't'::bool, 'off'::boolean"), "SELECT 1, 0");
        assert_eq!(
            t("SELECT '1.25'::numeric"),
            "SELECT CAST('1.25' AS NUMERIC)"
        );
        assert_eq!(t("SELECT '{\"a\": 1}'::jsonb"), "SELECT '{\"a\": 1}'");
    }

    #[test]
    fn bad_literals_and_unsupported_types_are_errors() {
        assert_eq!(code("SELECT 'abc'::int"), "22P02");
        assert_eq!(code("SELECT 'maybe'::bool"), "22P02");
        assert_eq!(code("SELECT '1 day'::interval"), "0A000");
        assert_eq!(code("SELECT '{1,2}'::int[]"), "0A000");
        assert_eq!(code("SELECT ARRAY[1, 2, 3]"), "0A000");
        assert_eq!(code("SELECT a::regclass FROM t"), "0A000");
        assert_eq!(code("SELECT 'NaN'::float8"), "0A000");
        assert_eq!(code("SELECT ::int"), "42601");
    }

    #[test]
    fn escape_strings_become_plain_literals() {
        assert_eq!(t("SELECT E'a\\nb\\'c'"), "SELECT 'a\nb''c'");
        assert_eq!(t("SELECT e'\\x41\\101'"), "SELECT 'AA'");
    }

    #[test]
    fn functions_and_operators() {
        assert_eq!(
            t("SELECT now()"),
            "SELECT strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')"
        );
        assert!(t("select pg_catalog.version()").starts_with("select ('PostgreSQL 16.6"));
        assert_eq!(t("select current_schema()"), "select 'public'");
        assert_eq!(
            t("SELECT * FROM t WHERE a ILIKE 'x%' AND b NOT ilike $1"),
            "SELECT * FROM t WHERE a LIKE 'x%' AND b NOT LIKE $1"
        );
        // A column named now is not a call.
        assert_eq!(t("SELECT now FROM t"), "SELECT now FROM t");
    }

    #[test]
    fn values_with_column_aliases_become_a_select() {
        assert_eq!(
            t(
                "INSERT INTO n (body) SELECT p0::VARCHAR FROM (VALUES ('a', 0), ('b', 1)) AS \
               imp_sen(p0, sen_counter) ORDER BY sen_counter RETURNING n.id"
            ),
            "INSERT INTO n (body) SELECT CAST(p0 AS TEXT) FROM (SELECT column1 AS p0, column2 \
             AS sen_counter FROM (VALUES ('a', 0), ('b', 1))) AS imp_sen ORDER BY sen_counter \
             RETURNING n.id"
        );
        // Other aliases are left alone.
        assert_eq!(t("SELECT a AS b FROM t AS u"), "SELECT a AS b FROM t AS u");
        assert_eq!(t("SELECT f(x) AS y(z)"), "SELECT f(x) AS y(z)");
    }

    #[test]
    fn serial_primary_keys_become_integer_primary_keys() {
        assert_eq!(
            t("CREATE TABLE t (id SERIAL PRIMARY KEY, name TEXT)"),
            "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)"
        );
        assert_eq!(
            t("create table t (id bigserial not null, n varchar(10), primary key (id))"),
            "create table t (id INTEGER not null, n varchar(10), primary key (id))"
        );
        assert_eq!(
            t("CREATE TABLE t (\"id\" SERIAL NOT NULL, PRIMARY KEY (\"id\"))"),
            "CREATE TABLE t (\"id\" INTEGER NOT NULL, PRIMARY KEY (\"id\"))"
        );
        assert_eq!(
            code("CREATE TABLE t (id INT PRIMARY KEY, n SERIAL)"),
            "0A000"
        );
        assert_eq!(
            code("CREATE TABLE t (a SERIAL, b INT, PRIMARY KEY (a, b))"),
            "0A000"
        );
        // Outside CREATE TABLE, serial is a name.
        assert_eq!(t("SELECT serial FROM t"), "SELECT serial FROM t");
    }
}
