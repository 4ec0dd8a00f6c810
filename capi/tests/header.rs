//! The checked-in header, include/gpuring.h, is what cbindgen makes of src/ now: a change to
//! the API that forgot the header fails here. Regenerate it with
//! `GPURING_BLESS=1 cargo test -p gpuring-c --test header`.

#[test]
fn the_checked_in_header_is_what_cbindgen_makes() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config =
        cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header")
        .write(&mut made);
    let path = format!("{dir}/include/gpuring.h");
    if std::env::var_os("GPURING_BLESS").is_some() {
        std::fs::write(&path, &made).expect("write the header");
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == made,
        "capi/include/gpuring.h is stale: regenerate it with \
         GPURING_BLESS=1 cargo test -p gpuring-c --test header"
    );
}
