//! The normaliser: one pure function from the raw bytes of a name to a valid `Name` (NFC
//! UTF-8) or the rule it breaks. Every name that enters the store passes through `Name::parse`:
//! lookup, create, mknod, mkdir, rename targets and import.

use std::fmt;

use unicode_normalization::UnicodeNormalization;

/// Longest name in bytes (after NFC normalisation), as on ext4.
pub const MAX_NAME_BYTES: usize = 255;

/// Which optional rules apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NameRules {
    /// Linux rules plus the store's own (UTF-8, no control or format characters).
    #[default]
    Linux,
    /// Also what keeps a store usable on Windows and macOS.
    Portable,
}

/// A name that passed every rule, in NFC.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Checks `raw` against the rules and returns its NFC form.
    pub fn parse(raw: &[u8], rules: NameRules) -> Result<Name, NameError> {
        let s = std::str::from_utf8(raw).map_err(|_| NameError::NotUtf8)?;
        if s.is_empty() {
            return Err(NameError::Empty);
        }
        if s.contains('/') {
            return Err(NameError::Slash);
        }
        if let Some(c) = s.chars().find(|c| c.is_control()) {
            return Err(NameError::Control(c));
        }
        if let Some(c) = s.chars().find(|&c| is_format_char(c)) {
            return Err(NameError::Format(c));
        }
        if let Some(c) = s.chars().find(|&c| is_invisible(c)) {
            return Err(NameError::Invisible(c));
        }
        // NFC leaves ASCII as it is: most names skip the normaliser.
        let nfc: String = if s.is_ascii() {
            s.to_string()
        } else {
            s.nfc().collect()
        };
        if nfc == "." || nfc == ".." {
            return Err(NameError::Dot);
        }
        if nfc.len() > MAX_NAME_BYTES {
            return Err(NameError::TooLong(nfc.len()));
        }
        if rules == NameRules::Portable {
            check_portable(&nfc)?;
        }
        Ok(Name(nfc))
    }

    /// Whether `raw` is a valid name already in NFC under Linux rules, decided from its
    /// bytes alone when every one is printable ASCII (what `parse` would accept unchanged);
    /// None when a byte is not, and only `parse` can tell. For scans of names already
    /// stored (`check`), where nearly every name is plain ASCII.
    pub fn plain_ascii_is_valid(raw: &[u8]) -> Option<bool> {
        if !raw.iter().all(|&b| (0x20..0x7f).contains(&b)) {
            return None;
        }
        Some(
            !raw.is_empty()
                && raw.len() <= MAX_NAME_BYTES
                && !raw.contains(&b'/')
                && raw != b"."
                && raw != b"..",
        )
    }

    /// The key under which case-insensitive siblings collide (portable rules).
    pub fn fold_case(&self) -> String {
        fold_case(&self.0)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The rule a name breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameError {
    NotUtf8,
    Empty,
    Slash,
    Dot,
    Control(char),
    Format(char),
    /// A blank or separator character outside category Cf (Hangul filler, blank Braille
    /// pattern, line separator).
    Invisible(char),
    TooLong(usize),
    PortableChar(char),
    PortableTrailing,
    PortableReserved,
    /// A sibling differs only in case (portable rules).
    PortableCaseClash,
}

impl NameError {
    /// The rule broken, as a fixed text: what refusals are rate-limited by in the log. The
    /// message (`Display`) carries what the caller chose (a length, a character), so a client
    /// could vary it at will.
    pub fn rule(&self) -> &'static str {
        match self {
            NameError::NotUtf8 => "name-not-utf8",
            NameError::Empty => "name-empty",
            NameError::Slash => "name-slash",
            NameError::Dot => "name-dot",
            NameError::Control(_) => "name-control-character",
            NameError::Format(_) => "name-format-character",
            NameError::Invisible(_) => "name-invisible-character",
            NameError::TooLong(_) => "name-too-long",
            NameError::PortableChar(_) => "portable-character",
            NameError::PortableTrailing => "portable-trailing",
            NameError::PortableReserved => "portable-reserved",
            NameError::PortableCaseClash => "portable-case-clash",
        }
    }

    /// The errno a caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            NameError::TooLong(_) => libc::ENAMETOOLONG,
            // Invalid UTF-8 is an illegal byte sequence, as on filesystems that enforce UTF-8.
            NameError::NotUtf8 => libc::EILSEQ,
            _ => libc::EINVAL,
        }
    }
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::NotUtf8 => write!(f, "name is not valid UTF-8"),
            NameError::Empty => write!(f, "name is empty"),
            NameError::Slash => write!(f, "name contains '/'"),
            NameError::Dot => write!(f, "name is '.' or '..'"),
            NameError::Control(c) => {
                write!(f, "name contains control character U+{:04X}", *c as u32)
            }
            NameError::Format(c) => write!(
                f,
                "name contains invisible format character U+{:04X}",
                *c as u32
            ),
            NameError::Invisible(c) => {
                write!(f, "name contains invisible character U+{:04X}", *c as u32)
            }
            NameError::TooLong(n) => {
                write!(f, "name is {n} bytes, over the limit of {MAX_NAME_BYTES}")
            }
            NameError::PortableChar(c) => {
                write!(f, "name contains {c:?}, not allowed under --names portable")
            }
            NameError::PortableTrailing => write!(
                f,
                "name ends with a dot or space, not allowed under --names portable"
            ),
            NameError::PortableCaseClash => write!(
                f,
                "a sibling differs only in letter case, not allowed under --names portable"
            ),
            NameError::PortableReserved => write!(
                f,
                "name is a reserved Windows device name, not allowed under --names portable"
            ),
        }
    }
}

/// Unicode general category Cf (format characters): invisible characters that change how text
/// around them displays, such as bidirectional overrides and zero-width joiners.
/// The key under which names collide when case is ignored: upper, then lower case, as the
/// targets' filesystems fold. Lower case alone keeps dotless i (U+0131) apart from I, which
/// NTFS's upcase table maps to one letter; "ß" and "ss", and the Kelvin sign and K, come
/// together too.
pub fn fold_case(name: &str) -> String {
    name.to_uppercase().to_lowercase()
}

/// Characters that render as nothing (or as a line break) but are not in category Cf:
/// Hangul fillers, the blank Braille pattern, and the line and paragraph separators.
fn is_invisible(c: char) -> bool {
    matches!(
        c as u32,
        0x115F | 0x1160 | 0x2028 | 0x2029 | 0x2800 | 0x3164 | 0xFFA0
    )
}

fn is_format_char(c: char) -> bool {
    matches!(c as u32,
        0x00AD | 0x0600..=0x0605 | 0x061C | 0x06DD | 0x070F | 0x0890..=0x0891 | 0x08E2
        | 0x180E | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F
        | 0xFEFF | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F
        | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F)
}

fn check_portable(name: &str) -> Result<(), NameError> {
    if let Some(c) = name
        .chars()
        .find(|c| matches!(c, '<' | '>' | ':' | '"' | '|' | '?' | '*' | '\\'))
    {
        return Err(NameError::PortableChar(c));
    }
    if name.ends_with('.') || name.ends_with(' ') {
        return Err(NameError::PortableTrailing);
    }
    let stem = name
        .split('.')
        .next()
        .unwrap_or("")
        .trim_end()
        .to_ascii_uppercase();
    // Windows reserves these device names with any extension, in any case: COM and LPT
    // with a digit 0-9 or a superscript 1-3.
    let port = |prefix: &str| {
        stem.strip_prefix(prefix).is_some_and(|rest| {
            let mut cs = rest.chars();
            matches!(
                (cs.next(), cs.next()),
                (Some('0'..='9' | '\u{B9}' | '\u{B2}' | '\u{B3}'), None)
            )
        })
    };
    let reserved = matches!(
        stem.as_str(),
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$" | "CLOCK$"
    ) || port("COM")
        || port("LPT");
    if reserved {
        return Err(NameError::PortableReserved);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> String {
        Name::parse(s.as_bytes(), NameRules::Linux).unwrap().0
    }

    fn err(raw: &[u8]) -> NameError {
        Name::parse(raw, NameRules::Linux).unwrap_err()
    }

    #[test]
    fn accepts_what_the_sdk_writes() {
        for n in [
            ".tmp-12345-0f8fad5b-d9cb-469f-a165-70867728950e",
            "notes.md",
            "my notes with spaces.txt",
            "\u{1F9E0} brain.md",
            "\u{4F1A}\u{8BAE}\u{8BB0}\u{5F55}.md",
            "caf\u{E9}",
            ".hidden",
            "...",
            &"a".repeat(255),
        ] {
            assert_eq!(ok(n), n);
        }
    }

    #[test]
    fn nfd_becomes_nfc() {
        assert_eq!(ok("cafe\u{301}"), "caf\u{E9}");
    }

    #[test]
    fn refuses_each_rule() {
        assert_eq!(err(b"\xff\xfe"), NameError::NotUtf8);
        assert_eq!(err(b""), NameError::Empty);
        assert_eq!(err(b"a/b"), NameError::Slash);
        assert_eq!(err(b"."), NameError::Dot);
        assert_eq!(err(b".."), NameError::Dot);
        assert_eq!(err(b"a\nb"), NameError::Control('\n'));
        assert_eq!(err(b"a\x7fb"), NameError::Control('\x7f'));
        assert_eq!(err(b"a\x00b"), NameError::Control('\0'));
        assert_eq!(err("a\u{202E}b".as_bytes()), NameError::Format('\u{202E}'));
        assert_eq!(err("a\u{200D}b".as_bytes()), NameError::Format('\u{200D}'));
        // Invisible, though not in category Cf, under either rules.
        for c in [
            '\u{3164}', '\u{2800}', '\u{2028}', '\u{2029}', '\u{115F}', '\u{FFA0}',
        ] {
            assert_eq!(err(format!("a{c}b").as_bytes()), NameError::Invisible(c));
            assert_eq!(
                Name::parse(c.to_string().as_bytes(), NameRules::Portable).unwrap_err(),
                NameError::Invisible(c)
            );
        }
        assert_eq!(err("x".repeat(256).as_bytes()), NameError::TooLong(256));
    }

    /// The ASCII fast path agrees with the full parser: on every name of up to three bytes
    /// drawn from ASCII's edges and its special characters, on names around the length
    /// limit, and it leaves every name with a byte outside printable ASCII to the parser.
    #[test]
    fn the_ascii_fast_path_agrees_with_the_parser() {
        let alphabet: Vec<u8> = [0x00, 0x01, 0x09, 0x0a, 0x1f, 0x20, 0x21, 0x2e, 0x2f, 0x30]
            .into_iter()
            .chain([0x3a, 0x41, 0x5c, 0x61, 0x7e, 0x7f, 0x80, 0xc3, 0xa9, 0xff])
            .collect();
        let mut names: Vec<Vec<u8>> = vec![Vec::new()];
        for len in 1..=3 {
            let mut next = Vec::new();
            for n in names.iter().filter(|n| n.len() == len - 1) {
                for &b in &alphabet {
                    let mut m = n.clone();
                    m.push(b);
                    next.push(m);
                }
            }
            names.extend(next);
        }
        for len in [254, 255, 256, 300] {
            names.push(vec![b'a'; len]);
            names.push([b"a/".as_slice(), &vec![b'b'; len - 2]].concat());
        }
        names.extend([b"...".to_vec(), b". ".to_vec(), b"a..".to_vec()]);
        for raw in &names {
            let parsed = Name::parse(raw, NameRules::Linux);
            let full = matches!(&parsed, Ok(n) if n.as_str().as_bytes() == raw.as_slice());
            match Name::plain_ascii_is_valid(raw) {
                Some(fast) => assert_eq!(fast, full, "{raw:?}: {parsed:?}"),
                None => assert!(
                    raw.iter().any(|b| !(0x20..0x7f).contains(b)),
                    "{raw:?} is printable ASCII"
                ),
            }
        }
    }

    #[test]
    fn errnos() {
        assert_eq!(NameError::TooLong(300).errno(), libc::ENAMETOOLONG);
        assert_eq!(NameError::NotUtf8.errno(), libc::EILSEQ);
        assert_eq!(NameError::Control('\n').errno(), libc::EINVAL);
    }

    #[test]
    fn portable_rules() {
        let p = |s: &str| Name::parse(s.as_bytes(), NameRules::Portable);
        assert_eq!(p("a:b").unwrap_err(), NameError::PortableChar(':'));
        assert_eq!(p("a?").unwrap_err(), NameError::PortableChar('?'));
        assert_eq!(p("trailing.").unwrap_err(), NameError::PortableTrailing);
        assert_eq!(p("trailing ").unwrap_err(), NameError::PortableTrailing);
        assert_eq!(p("CON").unwrap_err(), NameError::PortableReserved);
        assert_eq!(p("nul.txt").unwrap_err(), NameError::PortableReserved);
        assert_eq!(p("com1").unwrap_err(), NameError::PortableReserved);
        for reserved in ["CONIN$", "conout$.md", "COM\u{B9}", "lpt\u{B3}.txt", "COM0"] {
            assert_eq!(
                p(reserved).unwrap_err(),
                NameError::PortableReserved,
                "{reserved}"
            );
        }
        for fine in ["COM10", "console.md", "LPT", "com\u{2074}"] {
            assert!(p(fine).is_ok(), "{fine}");
        }
        // Full case folding: dotless i beside I, sharp s beside ss, Kelvin sign beside K.
        let fold = |s: &str| p(s).unwrap().fold_case();
        assert_eq!(fold("\u{131}.md"), fold("I.md"));
        assert_eq!(fold("stra\u{DF}e"), fold("STRASSE"));
        assert_eq!(fold("\u{212A}elvin"), fold("kelvin"));
        assert!(p("com10").is_ok());
        assert!(p("console.md").is_ok());
        assert!(p(".tmp-1-abc").is_ok());
        assert!(Name::parse(b"a:b", NameRules::Linux).is_ok());
    }
}
