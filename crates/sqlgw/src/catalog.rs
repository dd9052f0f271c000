//! PostgreSQL's system catalogs, as far as clients need them: the gateway recognises the
//! catalog queries that psql's `\dt`, `\d name` and `\l` send, and that drivers and ORMs send
//! at connection time (psycopg2's hstore look-up, SQLAlchemy's `has_table`), and rewrites
//! each into a query on SQLite's own schema (`sqlite_schema`, `pragma_table_info`), run by
//! the service like any other statement. Any other statement that reads a catalog is refused
//! with SQLSTATE 0A000 naming it, rather than failing with a syntax error or answering wrong.
//!
//! A table's oid is 16384 plus its row id in `sqlite_schema`.

use crate::translate::quote;
use crate::GwError;

/// The catalogs that hold nothing in a redoubt database (no row-level security policies,
/// extended statistics, publications, inheritance, rules or triggers that PostgreSQL's
/// catalogs would list), so a query on them alone rightly returns no rows.
const EMPTY: &[&str] = &[
    "pg_policy",
    "pg_statistic_ext",
    "pg_publication",
    "pg_publication_rel",
    "pg_publication_namespace",
    "pg_inherits",
    "pg_rewrite",
];

/// `sql` lower-cased, with the text of its `'...'` literals blanked out.
fn code_only(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quoted = false;
    for c in sql.chars() {
        if c == '\'' {
            quoted = !quoted;
            out.push(c);
        } else if quoted {
            out.push(' ');
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// True when `sql` reads PostgreSQL's system catalogs (outside its string literals).
pub fn reads_catalog(sql: &str) -> bool {
    let l = code_only(sql);
    l.contains("pg_catalog.pg_")
        || l.contains("information_schema.")
        || [
            "pg_class",
            "pg_type",
            "pg_namespace",
            "pg_attribute",
            "pg_database",
        ]
        .iter()
        .any(|t| contains_word(&l, t))
}

fn contains_word(hay: &str, word: &str) -> bool {
    hay.match_indices(word).any(|(i, _)| {
        let before = hay[..i].chars().next_back();
        let after = hay[i + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

/// The first `'...'` literal after `marker` in `sql` (case-insensitive), unquoted.
fn literal_after(sql: &str, marker: &str) -> Option<String> {
    let l = sql.to_ascii_lowercase();
    let at = l.find(&marker.to_ascii_lowercase())? + marker.len();
    let rest = sql[at..].trim_start();
    let rest = rest.strip_prefix('\'')?;
    let mut out = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            if chars.peek() == Some(&'\'') {
                chars.next();
                out.push('\'');
                continue;
            }
            return Some(out);
        }
        out.push(c);
    }
    None
}

/// The `'...'` literals of the list `'a', 'b')` after `marker` (case-insensitive); `None`
/// when anything else is in it (a placeholder).
fn literals_in(sql: &str, marker: &str) -> Option<Vec<String>> {
    let l = sql.to_ascii_lowercase();
    let mut at = l.find(&marker.to_ascii_lowercase())? + marker.len();
    let mut out = Vec::new();
    loop {
        let rest = &sql[at..];
        let trimmed = rest.trim_start();
        at += rest.len() - trimmed.len();
        let v = literal_after(&sql[at..], "")?;
        out.push(v.clone());
        // Past the literal: its text with doubled quotes, and the two quotes.
        at += v.len() + v.matches('\'').count() + 2;
        let rest = sql[at..].trim_start();
        if let Some(r) = rest.strip_prefix(',') {
            at = sql.len() - r.len();
        } else if rest.starts_with(')') {
            return Some(out);
        } else {
            return None;
        }
    }
}

/// True when each top-level `SELECT` of `sql` (its `UNION` parts) inner-joins a catalog
/// that is empty here, with no outer join: the query has no rows then (psql's footers of
/// `\d NAME` ask for policies, publications, inheritance...). Subqueries do not count.
fn only_empty_catalogs(sql: &str) -> bool {
    let l = code_only(sql);
    // The words at parenthesis depth 0.
    let mut words: Vec<String> = Vec::new();
    let mut depth = 0i32;
    let mut word = String::new();
    for c in l.chars().chain(std::iter::once(' ')) {
        if c.is_alphanumeric() || c == '_' || c == '.' {
            if depth == 0 {
                word.push(c);
            }
            continue;
        }
        if !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
    }
    let mut parts = 0;
    let mut in_from = false;
    let mut empty_here = false;
    for w in words
        .iter()
        .map(String::as_str)
        .chain(std::iter::once("union"))
    {
        match w {
            "left" | "right" | "full" | "outer" => return false,
            "from" => in_from = true,
            "where" | "group" | "order" | "having" | "limit" => in_from = false,
            "union" | "intersect" | "except" => {
                if !empty_here {
                    return false;
                }
                parts += 1;
                in_from = false;
                empty_here = false;
            }
            _ if in_from => {
                let table = w.strip_prefix("pg_catalog.").unwrap_or(w);
                empty_here |= EMPTY.contains(&table);
            }
            _ => {}
        }
    }
    parts > 0
}

/// The oid in `marker '16385'`.
fn oid_after(sql: &str, marker: &str) -> Option<i64> {
    literal_after(sql, marker)?.trim().parse().ok()
}

/// A table name from psql's pattern `^(name)$`, when it names one table exactly.
fn exact_name(pattern: &str) -> Option<&str> {
    let name = pattern.strip_prefix("^(")?.strip_suffix(")$")?;
    name.chars()
        .all(|c| c.is_alphanumeric() || c == '_')
        .then_some(name)
}

fn unsupported(what: &str) -> GwError {
    GwError::new(
        "0A000",
        format!(
            "{what} is not supported by the redoubt SQL gateway: it has no PostgreSQL system \
             catalogs (pg_catalog, information_schema); it answers psql's \\dt, \\d TABLE and \
             \\l, and sqlite_schema or PRAGMA table_info(...) can be read instead"
        ),
    )
}

const USER_TABLES: &str = "type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'";

/// The statement to run instead of catalog query `sql` (see the module documentation), or
/// why it is refused.
pub fn rewrite(sql: &str) -> Result<String, GwError> {
    let l = sql.to_ascii_lowercase();
    // psycopg2's (and SQLAlchemy's) look-up of the hstore extension's type: not installed.
    if l.contains("pg_type") && l.contains("typname = 'hstore'") {
        return Ok("SELECT NULL AS oid, NULL AS typarray WHERE 0".into());
    }
    // psql's \l (and psql -l).
    if l.contains("pg_catalog.pg_database d") && l.contains("as \"name\"") {
        return Ok(
            "SELECT 'redoubt' AS \"Name\", 'redoubt' AS \"Owner\", 'UTF8' AS \"Encoding\", \
             'C' AS \"Collate\", 'C' AS \"Ctype\", NULL AS \"ICU Locale\", \
             'libc' AS \"Locale Provider\", NULL AS \"Access privileges\""
                .into(),
        );
    }
    // psql's \dt (and \d with no name: tables only, as SQLite's views are refused).
    if l.contains("c.relkind in (") && l.contains("as \"owner\"") && l.contains("as \"name\"") {
        if l.contains("operator(pg_catalog.~)") {
            let name = literal_after(sql, "OPERATOR(pg_catalog.~)")
                .and_then(|p| exact_name(&p).map(str::to_string))
                .ok_or_else(|| unsupported("a \\d pattern other than an exact table name"))?;
            return Ok(format!(
                "SELECT 'public' AS \"Schema\", name AS \"Name\", type AS \"Type\", \
                 'redoubt' AS \"Owner\" FROM sqlite_schema WHERE {USER_TABLES} AND name = {} \
                 ORDER BY 1, 2",
                quote(&name)
            ));
        }
        return Ok(format!(
            "SELECT 'public' AS \"Schema\", name AS \"Name\", type AS \"Type\", \
             'redoubt' AS \"Owner\" FROM sqlite_schema WHERE {USER_TABLES} ORDER BY 1, 2"
        ));
    }
    // psql's \d NAME, first step: the table's oid.
    if l.contains("select c.oid,")
        && l.contains("n.nspname,")
        && l.contains("c.relname")
        && l.contains("operator(pg_catalog.~)")
    {
        let name = literal_after(sql, "OPERATOR(pg_catalog.~)")
            .and_then(|p| exact_name(&p).map(str::to_string))
            .ok_or_else(|| unsupported("a \\d pattern other than an exact table name"))?;
        return Ok(format!(
            "SELECT 16384 + rowid AS oid, 'public' AS nspname, name AS relname \
             FROM sqlite_schema WHERE {USER_TABLES} AND name = {}",
            quote(&name)
        ));
    }
    // \d NAME: the table's properties (no checks psql could list, indexes, rules, triggers).
    if l.contains("c.relchecks, c.relkind, c.relhasindex") {
        let oid = oid_after(sql, "WHERE c.oid =").ok_or_else(|| unsupported("this query"))?;
        return Ok(format!(
            "SELECT 0 AS relchecks, CASE type WHEN 'view' THEN 'v' ELSE 'r' END AS relkind, \
             'f' AS relhasindex, 'f' AS relhasrules, 'f' AS relhastriggers, \
             'f' AS relrowsecurity, 'f' AS relforcerowsecurity, 'f' AS relhasoids, \
             'f' AS relispartition, '' AS reloptions, 0 AS reltablespace, '' AS reloftype, \
             'p' AS relpersistence, 'd' AS relreplident, 'heap' AS amname \
             FROM sqlite_schema WHERE 16384 + rowid = {oid}"
        ));
    }
    // \d NAME: the columns.
    if l.contains("a.attname") && l.contains("pg_catalog.pg_attribute a") {
        let oid = oid_after(sql, "a.attrelid =").ok_or_else(|| unsupported("this query"))?;
        return Ok(format!(
            "SELECT p.name AS attname, lower(p.type) AS format_type, \
             p.dflt_value AS pg_get_expr, CASE WHEN p.\"notnull\" THEN 't' ELSE 'f' END \
             AS attnotnull, NULL AS attcollation, '' AS attidentity, '' AS attgenerated \
             FROM sqlite_schema AS s, pragma_table_info(s.name) AS p \
             WHERE 16384 + s.rowid = {oid} ORDER BY p.cid"
        ));
    }
    // SQLAlchemy's has_table for several tables at once (create_all): `relname IN (...)`.
    if l.starts_with("select pg_catalog.pg_class.relname")
        && l.contains("pg_catalog.pg_class.relname in (")
    {
        let names = literals_in(sql, "pg_catalog.pg_class.relname IN (")
            .ok_or_else(|| unsupported("SQLAlchemy's table look-up with bound names"))?;
        let list: Vec<String> = names.iter().map(|n| quote(n)).collect();
        return Ok(format!(
            "SELECT name AS relname FROM sqlite_schema WHERE {USER_TABLES} AND name IN ({})",
            list.join(", ")
        ));
    }
    // SQLAlchemy's has_table (psycopg2 inlines the name).
    if l.contains("pg_catalog.pg_class.relname")
        && l.contains("pg_catalog.pg_class.relname =")
        && l.contains("from pg_catalog.pg_class")
    {
        let name = literal_after(sql, "pg_catalog.pg_class.relname =")
            .ok_or_else(|| unsupported("SQLAlchemy's table look-up with a bound name"))?;
        return Ok(format!(
            "SELECT name AS relname FROM sqlite_schema WHERE {USER_TABLES} AND name = {}",
            quote(&name)
        ));
    }
    if only_empty_catalogs(sql) {
        return Ok("SELECT NULL AS \"none\" WHERE 0".into());
    }
    let first = sql.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
    Err(unsupported(&format!("this catalog query ({first} ...)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_catalog_queries() {
        assert!(!reads_catalog("select pg_catalog.version()"));
        assert!(!reads_catalog("INSERT INTO t VALUES ('see pg_class')"));
        assert!(reads_catalog("SELECT * FROM pg_catalog.pg_proc"));
        assert!(reads_catalog("SELECT * FROM pg_type"));
        assert!(reads_catalog("select * from information_schema.tables"));
        assert!(!reads_catalog("SELECT my_pg_class FROM t"));
        assert!(!reads_catalog("SELECT * FROM t"));
    }

    #[test]
    fn psql_describe_queries_read_sqlite_schema() {
        let dt = "SELECT n.nspname as \"Schema\",\n  c.relname as \"Name\",\n  CASE c.relkind \
                  WHEN 'r' THEN 'table' END as \"Type\",\n  \
                  pg_catalog.pg_get_userbyid(c.relowner) as \"Owner\"\nFROM pg_catalog.pg_class c\
                  \n     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace\nWHERE \
                  c.relkind IN ('r','p','')\n  AND pg_catalog.pg_table_is_visible(c.oid)\n\
                  ORDER BY 1,2;";
        assert!(rewrite(dt).unwrap().contains("FROM sqlite_schema"));
        let d1 = "SELECT c.oid,\n  n.nspname,\n  c.relname\nFROM pg_catalog.pg_class c\n     \
                  LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace\nWHERE \
                  c.relname OPERATOR(pg_catalog.~) '^(items)$' COLLATE pg_catalog.default\n  \
                  AND pg_catalog.pg_table_is_visible(c.oid)\nORDER BY 2, 3;";
        assert!(rewrite(d1).unwrap().contains("name = 'items'"));
        let bad = d1.replace("^(items)$", "^(it.*)$");
        assert_eq!(rewrite(&bad).unwrap_err().code, "0A000");
        let d3 = "SELECT a.attname,\n  pg_catalog.format_type(a.atttypid, a.atttypmod)\nFROM \
                  pg_catalog.pg_attribute a\nWHERE a.attrelid = '16385' AND a.attnum > 0";
        assert!(rewrite(d3).unwrap().contains("= 16385"));
        let pol = "SELECT pol.polname FROM pg_catalog.pg_policy pol WHERE pol.polrelid = '1'";
        assert!(rewrite(pol).unwrap().contains("WHERE 0"));
        let publications = "SELECT pubname , NULL , NULL\nFROM pg_catalog.pg_publication p\n\
                            JOIN pg_catalog.pg_publication_namespace pn ON p.oid = pn.pnpubid\n\
                            JOIN pg_catalog.pg_class pc ON pc.relnamespace = pn.pnnspid\n\
                            WHERE pc.oid ='16386'\nUNION\nSELECT pubname, NULL, NULL\nFROM \
                            pg_catalog.pg_publication p\nWHERE p.puballtables\nORDER BY 1;";
        assert!(rewrite(publications).unwrap().contains("WHERE 0"));
        // An outer join to an empty catalog keeps the other side's rows: refused.
        let outer = "SELECT c.relname FROM pg_catalog.pg_inherits i RIGHT JOIN \
                     pg_catalog.pg_class c ON c.oid = i.inhrelid";
        assert_eq!(rewrite(outer).unwrap_err().code, "0A000");
        let inherits = "SELECT c.oid::pg_catalog.regclass\nFROM pg_catalog.pg_class c, \
                        pg_catalog.pg_inherits i\nWHERE c.oid = i.inhparent AND i.inhrelid = \
                        '16386'\n  AND c.relispartition = false\nORDER BY inhseqno;";
        assert!(rewrite(inherits).unwrap().contains("WHERE 0"));
        let policies = "SELECT pol.polname, CASE WHEN pol.polroles = '{0}' THEN NULL ELSE \
                        pg_catalog.array_to_string(array(select rolname from \
                        pg_catalog.pg_roles where oid = any (pol.polroles) order by 1),',') \
                        END\nFROM pg_catalog.pg_policy pol\nWHERE pol.polrelid = '16386' \
                        ORDER BY 1;";
        assert!(rewrite(policies).unwrap().contains("WHERE 0"));
        // A UNION part that reads another catalog: refused.
        let mixed = "SELECT polname FROM pg_catalog.pg_policy UNION SELECT relname FROM \
                     pg_catalog.pg_class";
        assert_eq!(rewrite(mixed).unwrap_err().code, "0A000");
        assert_eq!(
            rewrite("SELECT * FROM pg_catalog.pg_proc")
                .unwrap_err()
                .code,
            "0A000"
        );
    }

    #[test]
    fn driver_queries() {
        let hstore = "SELECT t.oid, typarray\nFROM pg_type t JOIN pg_namespace ns\n    ON \
                      typnamespace = ns.oid\nWHERE typname = 'hstore';\n";
        assert!(rewrite(hstore).unwrap().contains("WHERE 0"));
        let has_table = "SELECT pg_catalog.pg_class.relname \nFROM pg_catalog.pg_class JOIN \
                         pg_catalog.pg_namespace ON pg_catalog.pg_namespace.oid = \
                         pg_catalog.pg_class.relnamespace \nWHERE pg_catalog.pg_class.relname \
                         = 'sa_users' AND pg_catalog.pg_class.relkind = ANY (ARRAY['r', 'p'])";
        assert!(rewrite(has_table).unwrap().contains("name = 'sa_users'"));
        let multi = "SELECT pg_catalog.pg_class.relname \nFROM pg_catalog.pg_class JOIN \
                     pg_catalog.pg_namespace ON pg_catalog.pg_namespace.oid = \
                     pg_catalog.pg_class.relnamespace \nWHERE pg_catalog.pg_class.relname IN \
                     ('sa_notes', 'it''s') AND pg_catalog.pg_class.relkind = ANY (ARRAY['r'])";
        assert!(
            rewrite(multi)
                .unwrap()
                .contains("name IN ('sa_notes', 'it''s')"),
            "{}",
            rewrite(multi).unwrap()
        );
    }
}
