//! Reverse deltas of content: a chunk's earlier version kept as what differs from a later
//! one. Memory edits replace or insert text in one place, so a version is its base's common
//! prefix, the bytes that differ, and its base's common suffix; the delta holds the lengths,
//! those middle bytes, and the CRC-32C and length of the whole version it stands for.
//!
//! Invariant kept here: `apply` returns exactly the content `diff` was given, or an error;
//! a delta applied to any other base (a wrong, changed or erased one) fails its checksum.
//!
//! Layout (little-endian, 16 bytes then the middle):
//!
//! ```text
//! 0   u32  CRC-32C of the version's whole content
//! 4   u32  the version's length
//! 8   u32  bytes taken from the start of the base
//! 12  u32  bytes taken from the end of the base
//! 16  ...  the version's bytes between the two
//! ```

/// Bytes a delta adds to the middle it holds.
pub const HEADER_LEN: usize = 16;

/// Why a delta does not give its version back.
#[derive(Debug, PartialEq, Eq)]
pub enum DeltaError {
    /// Too short, or its lengths do not fit the base or add up.
    Malformed,
    /// Applied, the content does not match the version's checksum.
    Checksum,
}

/// The delta that rebuilds `target` from `base`.
pub fn diff(target: &[u8], base: &[u8]) -> Vec<u8> {
    let max = target.len().min(base.len());
    let prefix = target.iter().zip(base).take_while(|(a, b)| a == b).count();
    // The suffix never overlaps the prefix, in either version.
    let suffix = target[prefix..]
        .iter()
        .rev()
        .zip(base[prefix..].iter().rev())
        .take(max - prefix)
        .take_while(|(a, b)| a == b)
        .count();
    let middle = &target[prefix..target.len() - suffix];
    let mut out = Vec::with_capacity(HEADER_LEN + middle.len());
    out.extend_from_slice(&crc32c::crc32c(target).to_le_bytes());
    for n in [target.len(), prefix, suffix] {
        out.extend_from_slice(&(n as u32).to_le_bytes());
    }
    out.extend_from_slice(middle);
    out
}

/// The length of the version `delta` rebuilds, without applying it.
pub fn target_len(delta: &[u8]) -> Option<u64> {
    delta
        .get(4..8)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as u64)
}

/// The version `delta` rebuilds from `base`, verified against its checksum.
pub fn apply(delta: &[u8], base: &[u8]) -> Result<Vec<u8>, DeltaError> {
    if delta.len() < HEADER_LEN {
        return Err(DeltaError::Malformed);
    }
    let field = |i: usize| u32::from_le_bytes(delta[4 * i..4 * i + 4].try_into().unwrap());
    let (sum, len, prefix, suffix) = (
        field(0),
        field(1) as usize,
        field(2) as usize,
        field(3) as usize,
    );
    let middle = &delta[HEADER_LEN..];
    if prefix.checked_add(suffix).is_none_or(|n| n > base.len())
        || prefix + suffix + middle.len() != len
    {
        return Err(DeltaError::Malformed);
    }
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&base[..prefix]);
    out.extend_from_slice(middle);
    out.extend_from_slice(&base[base.len() - suffix..]);
    if crc32c::crc32c(&out) != sum {
        return Err(DeltaError::Checksum);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(target: &[u8], base: &[u8]) -> Vec<u8> {
        let d = diff(target, base);
        assert_eq!(apply(&d, base).as_deref(), Ok(target));
        assert_eq!(target_len(&d), Some(target.len() as u64));
        d
    }

    fn text(n: usize) -> Vec<u8> {
        (0..n).map(|i| b"abcdefghij"[i % 10]).collect()
    }

    #[test]
    fn a_small_replace_costs_what_changed() {
        let base = text(20_000);
        let mut target = base.clone();
        target[9_000..9_008].copy_from_slice(b"EIGHTBYT");
        let d = round_trip(&target, &base);
        assert_eq!(d.len(), HEADER_LEN + 8);
    }

    #[test]
    fn an_insert_and_a_removal_cost_what_changed() {
        let base = text(5_000);
        let mut target = base.clone();
        target.splice(2_500..2_500, b"inserted line\n".iter().copied());
        assert_eq!(round_trip(&target, &base).len(), HEADER_LEN + 14);
        // The other way: the version is shorter than its base.
        assert_eq!(round_trip(&base, &target).len(), HEADER_LEN);
    }

    #[test]
    fn prefix_and_suffix_never_overlap() {
        // "aaaa" against "aaaaaa": every byte is both a prefix and a suffix byte.
        round_trip(b"aaaa", b"aaaaaa");
        round_trip(b"aaaaaa", b"aaaa");
        round_trip(b"abab", b"ababab");
        round_trip(b"xabcabc", b"abc");
        let d = round_trip(b"abcXabc", b"abcabc");
        assert_eq!(d.len(), HEADER_LEN + 1);
    }

    #[test]
    fn empty_identical_and_whole_changes() {
        assert_eq!(round_trip(b"", b"").len(), HEADER_LEN);
        assert_eq!(round_trip(b"", b"base").len(), HEADER_LEN);
        assert_eq!(round_trip(b"new", b"").len(), HEADER_LEN + 3);
        let same = text(3_000);
        assert_eq!(round_trip(&same, &same).len(), HEADER_LEN);
        let other: Vec<u8> = (0..3_000).map(|i| (i % 7) as u8 + b'0').collect();
        assert_eq!(round_trip(&other, &same).len(), HEADER_LEN + 3_000);
    }

    #[test]
    fn a_wrong_base_or_a_flipped_bit_is_caught() {
        let base = text(4_000);
        let mut target = base.clone();
        target[100] = b'Z';
        let d = diff(&target, &base);
        // Another base of the same length: the checksum catches it.
        let mut other = base.clone();
        other[3_000] = b'Q';
        assert_eq!(apply(&d, &other), Err(DeltaError::Checksum));
        // An erased base (a redacted blob reads as empty).
        assert_eq!(apply(&d, b""), Err(DeltaError::Malformed));
        // A flipped bit in the middle bytes, and in a length.
        let mut bad = d.clone();
        bad[HEADER_LEN] ^= 1;
        assert_eq!(apply(&bad, &base), Err(DeltaError::Checksum));
        let mut bad = d.clone();
        bad[8] ^= 1;
        assert!(apply(&bad, &base).is_err());
        assert_eq!(apply(&d[..10], &base), Err(DeltaError::Malformed));
    }
}
