//! Replays what the fuzzer keeps (fuzz/): every input of each target's corpus
//! (fuzz/corpus/TARGET, the seeds and what libFuzzer found new coverage with) and of its
//! regressions (fuzz/regressions/TARGET, inputs that once crashed), through the same entry
//! point as the fuzz target, on the stable toolchain and without libFuzzer. A missing or empty
//! corpus fails, so the replay cannot pass by finding nothing. gst/tests/frame_header_replay.rs
//! does the same for the `frame_header` target.
#![cfg(feature = "test-support")]

use std::path::{Path, PathBuf};

/// Every input of `target`: its corpus, which must hold some, and its regressions, if any.
fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let corpus = read_all(&fuzz.join("corpus").join(target))
        .unwrap_or_else(|e| panic!("fuzz/corpus/{target}: {e}"));
    assert!(!corpus.is_empty(), "fuzz/corpus/{target} holds no input");
    let regressions = fuzz.join("regressions").join(target);
    let found = if regressions.exists() {
        read_all(&regressions).unwrap_or_else(|e| panic!("fuzz/regressions/{target}: {e}"))
    } else {
        Vec::new()
    };
    corpus.into_iter().chain(found).collect()
}

fn read_all(dir: &Path) -> std::io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        // Skip libFuzzer's temporary files and anything that is not a plain file.
        let hidden = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if path.is_file() && !hidden {
            out.push((path.clone(), std::fs::read(&path)?));
        }
    }
    out.sort();
    Ok(out)
}

/// Runs `entry` over every input of `target`, naming the input that panics.
fn replay(target: &str, entry: fn(&[u8])) {
    let inputs = inputs(target);
    for (path, data) in &inputs {
        if std::panic::catch_unwind(|| entry(data)).is_err() {
            panic!("fuzz target {target}: input {} panicked (message above)", path.display());
        }
    }
    eprintln!("fuzz target {target}: {} inputs replayed", inputs.len());
}

#[test]
fn segment_corpus_replays() {
    replay("segment", gpuring::testing::fuzzing::segment);
}

#[cfg(feature = "zenoh")]
#[test]
fn bridge_message_corpus_replays() {
    replay("bridge_message", gpuring::testing::fuzzing::bridge_message);
}

#[cfg(feature = "cuda")]
#[test]
fn vmm_offer_corpus_replays() {
    replay("vmm_offer", gpuring::testing::fuzzing::vmm_offer);
    // The seeds are valid offers: the replay reaches the checks of an accepted one.
    let accepted = inputs("vmm_offer")
        .iter()
        .filter(|(_, d)| {
            let (Some(&fds), Some(epoch)) = (d.first(), d.get(1..9)) else { return false };
            let epoch = u64::from_le_bytes(epoch.try_into().unwrap());
            gpuring::format::offer::decode(&d[9..], fds as usize, epoch).is_ok()
        })
        .count();
    assert!(accepted > 0, "no input of fuzz/corpus/vmm_offer is an accepted offer");
}
