//! Replays the `frame_header` fuzz target's inputs (fuzz/corpus/frame_header, and
//! fuzz/regressions/frame_header if any) through `gstgpuring::header` on the stable toolchain,
//! with the target's checks: a header that reads writes back to bytes that read equal, leaves
//! the bytes outside the frame header alone, and writes the same bytes again. A missing or
//! empty corpus fails, so the replay cannot pass by finding nothing.

use std::path::{Path, PathBuf};

use gstgpuring::header::fuzz_check;

fn read_all(dir: &Path) -> std::io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let hidden = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if path.is_file() && !hidden {
            out.push((path.clone(), std::fs::read(&path)?));
        }
    }
    out.sort();
    Ok(out)
}

#[test]
fn frame_header_corpus_replays() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let corpus = read_all(&fuzz.join("corpus/frame_header"))
        .unwrap_or_else(|e| panic!("fuzz/corpus/frame_header: {e}"));
    assert!(!corpus.is_empty(), "fuzz/corpus/frame_header holds no input");
    let regressions = fuzz.join("regressions/frame_header");
    let found = if regressions.exists() {
        read_all(&regressions).unwrap_or_else(|e| panic!("fuzz/regressions/frame_header: {e}"))
    } else {
        Vec::new()
    };
    let mut read = 0;
    for (path, data) in corpus.iter().chain(&found) {
        match std::panic::catch_unwind(|| fuzz_check(data)) {
            Ok(header) => read += usize::from(header),
            Err(_) => panic!("input {} panicked (message above)", path.display()),
        }
    }
    // The seeds are valid headers: the replay reaches the write-back checks.
    assert!(read > 0, "no input of fuzz/corpus/frame_header reads as a frame header");
}
