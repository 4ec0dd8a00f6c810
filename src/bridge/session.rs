//! The Zenoh session a bridge runs on: its mode and endpoints, from flags or a Zenoh
//! configuration file.

use std::path::PathBuf;

use super::BridgeError;

/// How the session joins the Zenoh network.
///
/// ```
/// use gpuring::bridge::{ZenohMode, ZenohOptions};
/// let o = ZenohOptions { mode: ZenohMode::Client, connect: vec!["tcp/router:7447".into()], ..Default::default() };
/// # let _ = o;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ZenohMode {
    /// Talks to other peers directly (and finds them by scouting unless endpoints are given).
    #[default]
    Peer,
    /// Talks only through a Zenoh router it connects to.
    Client,
}

/// Where and how a bridge's Zenoh session connects.
///
/// ```
/// use gpuring::bridge::{ZenohMode, ZenohOptions};
///
/// // Listen on a TCP port; the other side connects to it.
/// let o = ZenohOptions { listen: vec!["tcp/0.0.0.0:7447".into()], ..ZenohOptions::default() };
/// assert_eq!(o.mode, ZenohMode::Peer);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ZenohOptions {
    /// Peer (default) or client.
    pub mode: ZenohMode,
    /// Endpoints to connect to (`tcp/10.0.0.5:7447`).
    pub connect: Vec<String>,
    /// Endpoints to listen on (`tcp/0.0.0.0:7447`).
    pub listen: Vec<String>,
    /// A Zenoh configuration file (JSON5) to start from; the fields above override it.
    pub config_file: Option<PathBuf>,
    /// Turns multicast scouting off (peers then meet only through the endpoints given).
    pub no_multicast_scouting: bool,
}

impl ZenohOptions {
    /// The session's configuration.
    pub(crate) fn config(&self) -> Result<zenoh::Config, BridgeError> {
        let z = |e: zenoh::Error| BridgeError::Zenoh(e.to_string());
        let mut c = match &self.config_file {
            Some(path) => zenoh::Config::from_file(path).map_err(z)?,
            None => zenoh::Config::default(),
        };
        let mode = match self.mode {
            ZenohMode::Peer => "\"peer\"",
            ZenohMode::Client => "\"client\"",
        };
        c.insert_json5("mode", mode).map_err(z)?;
        if !self.connect.is_empty() {
            c.insert_json5("connect/endpoints", &json_list(&self.connect)).map_err(z)?;
        }
        if !self.listen.is_empty() {
            c.insert_json5("listen/endpoints", &json_list(&self.listen)).map_err(z)?;
        }
        if self.no_multicast_scouting {
            c.insert_json5("scouting/multicast/enabled", "false").map_err(z)?;
        }
        Ok(c)
    }

    /// Opens the session.
    pub(crate) fn open(&self) -> Result<zenoh::Session, BridgeError> {
        use zenoh::Wait;
        let config = self.config()?;
        zenoh::open(config).wait().map_err(|e| BridgeError::Zenoh(e.to_string()))
    }
}

/// `["a","b"]`: the endpoints as a JSON list (Rust's string quoting is JSON's for them).
fn json_list(v: &[String]) -> String {
    let quoted: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(","))
}
