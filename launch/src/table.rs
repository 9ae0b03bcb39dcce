//! Tables for people: rows of cells in columns, each as wide as its widest cell (in
//! characters) and two spaces apart, as the records, the doctor's links, cables and sweep
//! print them.

/// `rows` as lines, each column padded to its widest cell plus two spaces, trailing spaces
/// trimmed. Rows may have different lengths: a column's width is that of the rows that reach
/// it.
pub(crate) fn aligned<R: AsRef<[String]>>(rows: &[R]) -> Vec<String> {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (c, cell) in row.as_ref().iter().enumerate() {
            let n = cell.chars().count();
            match widths.get_mut(c) {
                Some(w) => *w = (*w).max(n),
                None => widths.push(n),
            }
        }
    }
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (c, cell) in row.as_ref().iter().enumerate() {
                line += cell;
                line += &" ".repeat(widths[c] - cell.chars().count() + 2);
            }
            line.trim_end().to_owned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_two_spaces_apart_and_lines_end_trimmed() {
        let rows = [
            ["rank", "µs", ""].map(str::to_owned),
            ["12", "3", "x"].map(str::to_owned),
        ];
        assert_eq!(aligned(&rows), ["rank  µs", "12    3   x"]);
    }
}
