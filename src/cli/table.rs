//! Plain text tables for the CLI.

/// Renders rows under headers, columns padded to their widest cell.
pub(super) fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> =
            cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}", w = *w)).collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    if rows.is_empty() {
        out.push_str("(none)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn pads_columns() {
        let t = super::render(
            &["ID", "NAME"],
            &[vec!["1".into(), "alpha".into()], vec!["22".into(), "b".into()]],
        );
        assert_eq!(t, "ID  NAME\n1   alpha\n22  b\n");
        assert_eq!(super::render(&["A"], &[]), "A\n(none)\n");
    }
}
