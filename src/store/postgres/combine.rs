//! A rule's writes as few statements as may be (`apply.rs` makes the writes): why and
//! how is [`combine`]'s comment.

use tokio_postgres::types::ToSql;

/// One write of a rule: the table it changes (`""`: none), its statement (parameters
/// from `$1`) and their values.
pub(super) struct Write<'a> {
    table: &'static str,
    sql: &'static str,
    params: Vec<&'a (dyn ToSql + Sync)>,
}

impl<'a> Write<'a> {
    pub(super) fn new(
        table: &'static str,
        sql: &'static str,
        params: Vec<&'a (dyn ToSql + Sync)>,
    ) -> Self {
        Self { table, sql, params }
    }
}

/// `writes` as few statements as may be: consecutive writes become one statement of
/// data-modifying `WITH` queries, each run to its end in this order (the last query
/// counts their rows, left to right). Why: each statement costs PostgreSQL an
/// execution of its own, and a rule's writes were 4-6 of a dispatch's 10 (issue 44).
///
/// The queries of one statement see the same snapshot, not each other's changes, and
/// two of them must not change the same row. Those of `deliveries`, `dedup` and
/// `queues` change disjoint rows (each key is one entry of a rule's changes; a claim
/// given back on its own is one of a delivery the changes leave out), but
/// `events`' (dispatched, pruned, bodies dropped) may meet: a second write of `events`
/// starts a statement of its own, after the first.
///
/// A statement's text depends only on which kinds of write a rule made (a subset of
/// these, in a fixed order), not on how many rows: few texts, each prepared once per
/// connection (`cached.rs`).
pub(super) fn combine<'a>(writes: &[Write<'a>]) -> Vec<(String, Vec<&'a (dyn ToSql + Sync)>)> {
    let mut groups: Vec<&[Write<'a>]> = Vec::new();
    let mut start = 0;
    for i in 0..writes.len() {
        let table = writes[i].table;
        if table == "events" && writes[start..i].iter().any(|w| w.table == table) {
            groups.push(&writes[start..i]);
            start = i;
        }
    }
    if start < writes.len() {
        groups.push(&writes[start..]);
    }
    groups
        .into_iter()
        .map(|group| match group {
            [one] => (one.sql.to_owned(), one.params.clone()),
            _ => {
                let mut sql = String::from("WITH ");
                let mut params = Vec::new();
                let mut counts = Vec::new();
                for (i, w) in group.iter().enumerate() {
                    if i > 0 {
                        sql.push_str(", ");
                    }
                    let returning = if w.table.is_empty() { "" } else { " RETURNING 1" };
                    sql.push_str(&format!(
                        "w{i} AS ({}{returning})",
                        renumber(w.sql, params.len())
                    ));
                    params.extend(w.params.iter().copied());
                    counts.push(format!("(SELECT count(*) FROM w{i})"));
                }
                sql.push_str(" SELECT ");
                sql.push_str(&counts.join(", "));
                (sql, params)
            }
        })
        .collect()
}

/// `sql` with each parameter `$n` renumbered `$(n + by)`. The statements here hold no
/// `$` but their parameters' (no string literal or dollar quoting).
fn renumber(sql: &str, by: usize) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut chars = sql.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        out.push(c);
        if c != '$' {
            continue;
        }
        let mut n = String::new();
        while let Some((_, d)) = chars.peek().copied().filter(|(_, d)| d.is_ascii_digit()) {
            n.push(d);
            chars.next();
        }
        match n.parse::<usize>() {
            Ok(n) => out.push_str(&(n + by).to_string()),
            Err(_) => out.push_str(&n),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{combine, renumber, Write};

    #[test]
    fn parameters_are_renumbered_whatever_their_digits_and_casts() {
        assert_eq!(
            renumber("SELECT $1::bigint[], $12, x FROM t WHERE a = $2", 9),
            "SELECT $10::bigint[], $21, x FROM t WHERE a = $11"
        );
        assert_eq!(renumber("no parameters", 4), "no parameters");
        assert_eq!(renumber("a lone $ sign", 4), "a lone $ sign");
    }

    /// Writes become one statement, in order, each run by the last query, with their
    /// parameters in turn; a second write of `events` starts a statement of its own.
    #[test]
    fn writes_are_combined_but_never_two_of_events() {
        let (a, b, c) = (1_i64, 2_i64, 3_i64);
        let writes = [
            Write::new("events", "UPDATE events SET x = $1", vec![&a]),
            Write::new("deliveries", "INSERT INTO deliveries SELECT $1, $2", vec![&b, &c]),
            Write::new("events", "DELETE FROM events WHERE id = $1", vec![&c]),
            Write::new("", "SELECT pg_notify($1, 'x')", vec![&a]),
        ];
        let statements = combine(&writes);
        let texts: Vec<&str> = statements.iter().map(|(sql, _)| sql.as_str()).collect();
        assert_eq!(
            texts,
            [
                "WITH w0 AS (UPDATE events SET x = $1 RETURNING 1), \
                 w1 AS (INSERT INTO deliveries SELECT $2, $3 RETURNING 1) \
                 SELECT (SELECT count(*) FROM w0), (SELECT count(*) FROM w1)",
                "WITH w0 AS (DELETE FROM events WHERE id = $1 RETURNING 1), \
                 w1 AS (SELECT pg_notify($2, 'x')) \
                 SELECT (SELECT count(*) FROM w0), (SELECT count(*) FROM w1)",
            ]
        );
        assert_eq!(statements.iter().map(|(_, p)| p.len()).collect::<Vec<_>>(), [3, 2]);
        let one = combine(&writes[..1]);
        assert_eq!(one[0].0, "UPDATE events SET x = $1", "a single write is sent as it is");
    }
}
