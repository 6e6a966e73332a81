//! Unified diffs of two texts, line by line, for `redbfs diff`: the longest common
//! subsequence of lines, printed as hunks with three lines of context.

/// The unified diff of `a` and `b`; empty when they are equal.
pub fn unified(a: &str, b: &str, a_label: &str, b_label: &str) -> String {
    let x: Vec<&str> = a.lines().collect();
    let y: Vec<&str> = b.lines().collect();
    if x == y {
        return String::new();
    }
    // Edit script from an LCS table (memories are small; O(n*m) is fine up to a few thousand lines).
    let (n, m) = (x.len(), y.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if x[i] == y[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // ops: (' ' | '-' | '+', a index, b index, text)
    let mut ops = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && x[i] == y[j] {
            ops.push((' ', i, j, x[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', i, j, x[i]));
            i += 1;
        } else {
            ops.push(('+', i, j, y[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 3;
    let mut out = format!("--- {a_label}\n+++ {b_label}\n");
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| o.0 != ' ')
        .map(|(k, _)| k)
        .collect();
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(CONTEXT);
        let mut end = changed[k];
        while k < changed.len() && changed[k] <= end + 2 * CONTEXT {
            end = changed[k];
            k += 1;
        }
        let end = (end + CONTEXT).min(ops.len() - 1);
        let hunk = &ops[start..=end];
        let a_start = hunk[0].1;
        let b_start = hunk[0].2;
        let a_len = hunk.iter().filter(|o| o.0 != '+').count();
        let b_len = hunk.iter().filter(|o| o.0 != '-').count();
        let pos = |s: usize, len: usize| if len == 0 { s } else { s + 1 };
        out.push_str(&format!(
            "@@ -{},{a_len} +{},{b_len} @@\n",
            pos(a_start, a_len),
            pos(b_start, b_len)
        ));
        for o in hunk {
            out.push_str(&format!("{}{}\n", o.0, o.3));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unified;

    #[test]
    fn equal_texts_have_no_diff() {
        assert_eq!(unified("a\nb\n", "a\nb\n", "x", "y"), "");
    }

    #[test]
    fn one_changed_line() {
        let d = unified("a\nb\nc\n", "a\nB\nc\n", "old", "new");
        assert_eq!(d, "--- old\n+++ new\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n");
    }

    #[test]
    fn from_nothing() {
        assert_eq!(
            unified("", "x\n", "old", "new"),
            "--- old\n+++ new\n@@ -0,0 +1,1 @@\n+x\n"
        );
    }
}
