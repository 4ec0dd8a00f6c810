//! Sizes on the command line: bytes, or with a `K` or `M` suffix (binary units). Shared with the
//! GPU bench (benches/gpu/main.rs includes this file).

/// `"64K"` -> 65536, `"8M"` -> 8388608, `"100"` -> 100.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    num.parse::<usize>().map(|n| n * mul).map_err(|e| format!("size {s}: {e}"))
}
