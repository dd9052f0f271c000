//! The gateway's view of SQL text: a small lexer that splits a query string into statements,
//! finds `$N` placeholders, and classifies statements the gateway answers itself
//! (transaction control, `SET`, `SHOW`) apart from those it sends to the service.
//!
//! The lexer knows what SQLite and PostgreSQL agree on: `'...'` strings, `"..."`, `` `...` ``
//! and `[...]` identifiers (doubled quotes inside), `--` and `/* */` comments. It does not
//! know `$$` quoting or `E'...'` backslash escapes (SQLite has neither). A `CREATE TRIGGER`
//! statement runs to the `END` that closes its body, as in `sqlite3_complete`.

/// A token of interest; everything else (operators, numbers, quoted text) is skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token<'a> {
    /// An unquoted word (keyword or identifier).
    Word(&'a str),
    /// `$N`: a positional parameter.
    Param(usize),
    /// `;` outside quotes and comments, at this byte offset.
    Semicolon(usize),
}

/// Calls `f` for each token of `sql`, in order.
fn lex<'a>(sql: &'a str, mut f: impl FnMut(Token<'a>)) {
    let b = sql.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'\'' | b'"' | b'`' | b'[' => {
                let close = if c == b'[' { b']' } else { c };
                i += 1;
                while i < b.len() {
                    if b[i] == close {
                        // A doubled quote is a quote inside the string.
                        if close != b']' && b.get(i + 1) == Some(&close) {
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    i += 1;
                }
                i += 1;
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i += 2;
            }
            b';' => {
                f(Token::Semicolon(i));
                i += 1;
            }
            b'$' => {
                let start = i + 1;
                let mut j = start;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
                if let Ok(n) = sql[start..j].parse() {
                    f(Token::Param(n));
                }
                i = j.max(i + 1);
            }
            _ if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] >= 0x80)
                {
                    i += 1;
                }
                f(Token::Word(&sql[start..i]));
            }
            _ => i += 1,
        }
    }
}

/// The statements of `sql`, each without its `;` and surrounding whitespace; statements
/// that hold only whitespace and comments are left out.
pub fn split(sql: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    // The first words of the current statement (enough to tell a `CREATE TRIGGER`) and its
    // last word (a trigger ends at `END;`).
    let mut lead: Vec<&str> = Vec::new();
    let mut last_word = "";
    lex(sql, |t| match t {
        Token::Word(w) => {
            if lead.len() < 3 {
                lead.push(w);
            }
            last_word = w;
        }
        Token::Param(_) => {}
        Token::Semicolon(at) => {
            if is_trigger(&lead) && !last_word.eq_ignore_ascii_case("END") {
                return;
            }
            push_statement(&mut out, &sql[start..at]);
            start = at + 1;
            lead.clear();
            last_word = "";
        }
    });
    push_statement(&mut out, &sql[start..]);
    out
}

fn push_statement<'a>(out: &mut Vec<&'a str>, s: &'a str) {
    let t = s.trim();
    if has_content(t) {
        out.push(t);
    }
}

fn is_trigger(lead: &[&str]) -> bool {
    let up = |i: usize| lead.get(i).map(|w| w.to_ascii_uppercase());
    up(0).as_deref() == Some("CREATE")
        && (up(1).as_deref() == Some("TRIGGER")
            || (matches!(up(1).as_deref(), Some("TEMP" | "TEMPORARY"))
                && up(2).as_deref() == Some("TRIGGER")))
}

/// `sql` after its leading whitespace and comments.
fn skip_trivia(sql: &str) -> &str {
    let mut s = sql;
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix("--") {
            s = rest.split_once('\n').map_or("", |(_, r)| r);
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = rest.split_once("*/").map_or("", |(_, r)| r);
        } else {
            return s;
        }
    }
}

/// True when `sql` holds something other than whitespace and comments.
fn has_content(sql: &str) -> bool {
    !skip_trivia(sql).is_empty()
}

/// The highest `$N` in `sql` (0 when it has none): the parameter count PostgreSQL would
/// infer.
pub fn placeholders(sql: &str) -> usize {
    let mut n = 0;
    lex(sql, |t| {
        if let Token::Param(p) = t {
            n = n.max(p);
        }
    });
    n
}

/// The first `k` words of `sql`, upper-cased.
fn leading_words(sql: &str, k: usize) -> Vec<String> {
    let mut out = Vec::new();
    lex(sql, |t| {
        if let Token::Word(w) = t {
            if out.len() < k {
                out.push(w.to_ascii_uppercase());
            }
        }
    });
    out
}

/// What a statement is, as far as the gateway is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `BEGIN`, `START TRANSACTION`.
    Begin,
    /// `COMMIT`, `END`.
    Commit,
    /// `ROLLBACK`, `ABORT`.
    Rollback,
    /// `SET ...`: accepted and ignored.
    Set,
    /// `RESET ...`: accepted and ignored.
    Reset,
    /// `SHOW name` (the name lower-cased).
    Show(String),
    /// `SAVEPOINT name` (the name as PostgreSQL folds it).
    Savepoint(String),
    /// `RELEASE [SAVEPOINT] name`.
    Release(String),
    /// `ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name`.
    RollbackTo(String),
    /// `DEALLOCATE [PREPARE] name` (`None`: `ALL`).
    Deallocate(Option<String>),
    /// A statement the gateway refuses (SQLSTATE 0A000): the feature's name.
    Unsupported(&'static str),
    /// Anything else: SQL for the service.
    Sql,
}

/// The last word or quoted identifier of `stmt`, as PostgreSQL folds names: a quoted name as
/// written, an unquoted one lower-cased ("" when there is none).
fn last_name(stmt: &str) -> String {
    let s = stmt.trim_end();
    if let Some(inner) = s.strip_suffix('"') {
        if let Some(open) = inner.rfind('"') {
            return inner[open + 1..].to_string();
        }
    }
    let start = s
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    let w = s[start..].to_lowercase();
    match w.as_str() {
        "savepoint" | "release" | "to" | "prepare" | "deallocate" => String::new(),
        _ => w,
    }
}

/// Classifies one statement (as [`split`] returns them).
pub fn classify(stmt: &str) -> Command {
    let w = leading_words(stmt, 4);
    let word = |i: usize| w.get(i).map(String::as_str).unwrap_or("");
    match word(0) {
        "BEGIN" | "START" => Command::Begin,
        "COMMIT" | "END" => Command::Commit,
        "ROLLBACK" | "ABORT" => {
            // ROLLBACK [TRANSACTION | WORK] TO [SAVEPOINT] name
            let next = if matches!(word(1), "TRANSACTION" | "WORK") {
                word(2)
            } else {
                word(1)
            };
            if next == "TO" {
                Command::RollbackTo(last_name(stmt))
            } else {
                Command::Rollback
            }
        }
        "SAVEPOINT" => Command::Savepoint(last_name(stmt)),
        "RELEASE" => Command::Release(last_name(stmt)),
        "SET" => Command::Set,
        "RESET" => Command::Reset,
        "SHOW" => {
            // The leading word is SHOW, so the text after the trivia starts with it.
            let rest = skip_trivia(stmt)[4..].trim();
            Command::Show(rest.trim_matches('"').to_ascii_lowercase())
        }
        "COPY" => Command::Unsupported("COPY"),
        "LISTEN" | "UNLISTEN" | "NOTIFY" => Command::Unsupported("LISTEN/NOTIFY"),
        "DEALLOCATE" => {
            let name = last_name(stmt);
            let all = name.is_empty() || (name == "all" && !stmt.trim_end().ends_with('"'));
            Command::Deallocate((!all).then_some(name))
        }
        "PREPARE" | "EXECUTE" => {
            Command::Unsupported("PREPARE/EXECUTE (use the extended query protocol)")
        }
        "DECLARE" | "FETCH" | "MOVE" | "CLOSE" => Command::Unsupported("cursors"),
        _ => Command::Sql,
    }
}

/// The PostgreSQL command tag for a statement that ran in the service: `verb` is
/// [`redoubt_services::sql::StmtResult::verb`], `rows` the rows it returned, `changes`
/// the rows it changed. Statements that return rows get `SELECT n` unless they change rows
/// (`INSERT ... RETURNING`).
pub fn command_tag(sql: &str, verb: &str, rows: usize, changes: u64) -> String {
    match verb {
        "INSERT" | "REPLACE" => format!("INSERT 0 {changes}"),
        "UPDATE" | "DELETE" => format!("{verb} {changes}"),
        "CREATE" | "DROP" | "ALTER" => {
            // CREATE [UNIQUE | TEMP | TEMPORARY | VIRTUAL] TABLE | INDEX | VIEW | TRIGGER ...
            let words = leading_words(sql, 4);
            let object = words
                .iter()
                .skip(1)
                .find(|w| !matches!(w.as_str(), "UNIQUE" | "TEMP" | "TEMPORARY" | "VIRTUAL"));
            match object {
                Some(o) => format!("{verb} {o}"),
                None => verb.to_string(),
            }
        }
        "SELECT" | "VALUES" | "WITH" | "EXPLAIN" | "PRAGMA" => format!("SELECT {rows}"),
        "" => "SELECT 0".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_semicolons_outside_quotes_and_comments() {
        let q = "INSERT INTO t VALUES ('a;b', \"c;d\"); -- x; y\nSELECT 1 /* ; */; ;  ; SELECT ';'";
        assert_eq!(
            split(q),
            vec![
                "INSERT INTO t VALUES ('a;b', \"c;d\")",
                "-- x; y\nSELECT 1 /* ; */",
                "SELECT ';'"
            ]
        );
    }

    #[test]
    fn doubled_quotes_stay_inside_the_string() {
        assert_eq!(
            split("SELECT 'it''s; fine'; SELECT 2"),
            vec!["SELECT 'it''s; fine'", "SELECT 2"]
        );
        assert_eq!(split("SELECT \"a\"\";b\""), vec!["SELECT \"a\"\";b\""]);
    }

    #[test]
    fn empty_and_comment_only_statements_are_left_out() {
        assert!(split("").is_empty());
        assert!(split(" ;; \n ;").is_empty());
        assert!(split("-- only a comment").is_empty());
        assert!(split("/* a */ ; -- b\n").is_empty());
        assert_eq!(split("SELECT 1;\n-- trailing comment"), vec!["SELECT 1"]);
    }

    #[test]
    fn unterminated_quotes_and_comments_end_the_text() {
        assert_eq!(split("SELECT 'abc; def"), vec!["SELECT 'abc; def"]);
        assert_eq!(split("SELECT 1 /* ; "), vec!["SELECT 1 /* ;"]);
    }

    #[test]
    fn a_trigger_body_is_one_statement() {
        let q = "CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE c SET n = n + 1; \
                 INSERT INTO log VALUES (1); END; SELECT 1";
        let s = split(q);
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(s[0].ends_with("END"), "{s:?}");
        assert_eq!(s[1], "SELECT 1");
        assert_eq!(
            split("create temp trigger x after delete on t begin delete from u; end").len(),
            1
        );
    }

    #[test]
    fn placeholders_are_counted_outside_quotes() {
        assert_eq!(placeholders("SELECT $1, $3 FROM t WHERE a = '$7'"), 3);
        assert_eq!(placeholders("SELECT 1 -- $4"), 0);
        assert_eq!(placeholders("SELECT $ , $x"), 0);
    }

    #[test]
    fn classifies_what_the_gateway_answers_itself() {
        assert_eq!(classify("begin"), Command::Begin);
        assert_eq!(
            classify("START TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
            Command::Begin
        );
        assert_eq!(classify("COMMIT"), Command::Commit);
        assert_eq!(classify("end transaction"), Command::Commit);
        assert_eq!(classify("ROLLBACK"), Command::Rollback);
        assert_eq!(classify("abort"), Command::Rollback);
        assert_eq!(
            classify("ROLLBACK TO SAVEPOINT a"),
            Command::RollbackTo("a".into())
        );
        assert_eq!(
            classify("rollback work to \"_pg3 X\""),
            Command::RollbackTo("_pg3 X".into())
        );
        assert_eq!(classify("SAVEPOINT A1"), Command::Savepoint("a1".into()));
        assert_eq!(
            classify("RELEASE SAVEPOINT _pg3_1"),
            Command::Release("_pg3_1".into())
        );
        assert_eq!(classify("release x"), Command::Release("x".into()));
        assert_eq!(classify("DEALLOCATE ALL"), Command::Deallocate(None));
        assert_eq!(
            classify("deallocate prepare _pg3_0"),
            Command::Deallocate(Some("_pg3_0".into()))
        );
        assert_eq!(
            classify("PREPARE p AS SELECT 1"),
            Command::Unsupported("PREPARE/EXECUTE (use the extended query protocol)")
        );
        assert_eq!(classify("SET search_path = x"), Command::Set);
        assert_eq!(
            classify("SHOW transaction_isolation"),
            Command::Show("transaction_isolation".into())
        );
        assert_eq!(
            classify("show \"DateStyle\""),
            Command::Show("datestyle".into())
        );
        assert_eq!(
            classify("/* x */ -- y\n SHOW TimeZone"),
            Command::Show("timezone".into())
        );
        assert_eq!(classify("COPY t FROM STDIN"), Command::Unsupported("COPY"));
        assert_eq!(classify("/* c */ SELECT 1"), Command::Sql);
        assert_eq!(
            classify("WITH x AS (SELECT 1) SELECT * FROM x"),
            Command::Sql
        );
        // Words inside strings are not keywords.
        assert_eq!(classify("'BEGIN'"), Command::Sql);
    }

    #[test]
    fn command_tags_follow_postgresql() {
        let cases = [
            ("SELECT * FROM t", "SELECT", 3, 0, "SELECT 3"),
            ("insert into t values (1)", "INSERT", 0, 1, "INSERT 0 1"),
            (
                "INSERT INTO t VALUES (1) RETURNING a",
                "INSERT",
                1,
                1,
                "INSERT 0 1",
            ),
            ("UPDATE t SET a = 1", "UPDATE", 0, 4, "UPDATE 4"),
            ("DELETE FROM t", "DELETE", 0, 0, "DELETE 0"),
            ("CREATE TABLE t (a INT)", "CREATE", 0, 0, "CREATE TABLE"),
            (
                "create unique index i on t (a)",
                "CREATE",
                0,
                0,
                "CREATE INDEX",
            ),
            ("DROP VIEW v", "DROP", 0, 0, "DROP VIEW"),
            (
                "WITH x AS (SELECT 1) SELECT * FROM x",
                "WITH",
                1,
                0,
                "SELECT 1",
            ),
        ];
        for (sql, verb, rows, changes, tag) in cases {
            assert_eq!(command_tag(sql, verb, rows, changes), tag, "{sql}");
        }
    }
}
