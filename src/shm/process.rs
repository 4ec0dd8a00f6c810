//! Process identity: a pid plus the process's start time, so that a reused pid is not mistaken
//! for the process that once had it.

use std::fs;

/// A process as recorded in a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessId {
    /// The pid.
    pub pid: u32,
    /// Start time in clock ticks after boot (`/proc/PID/stat` field 22).
    pub start_time: u64,
}

impl ProcessId {
    /// This process.
    pub fn current() -> ProcessId {
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        // Our own /proc entry is always readable; 0 only if /proc is not mounted.
        ProcessId { pid, start_time: start_time(pid).unwrap_or(0) }
    }

    /// Whether this process still runs. A pid that now belongs to a process with another start
    /// time counts as dead; a zombie counts as dead (it will not touch the segment again). Only
    /// a process that is not there (no /proc entry, and `kill(pid, 0)` says ESRCH) is dead: any
    /// other failure to read /proc (out of file descriptors, a `hidepid` mount hiding another
    /// user's process) says "alive", because taking a live peer for dead frees what it still
    /// uses.
    pub fn is_alive(&self) -> bool {
        if self.pid == 0 || self.pid > i32::MAX as u32 {
            return false;
        }
        match read_stat(self.pid) {
            Stat::Gone => false,
            Stat::Unknown => true,
            Stat::Running { state, start } => {
                state != 'Z' && state != 'X' && start == self.start_time
            }
        }
    }
}

/// Whether some process `pid` runs (not a zombie), whatever its start time. For an owner whose
/// start time is not known yet; a pid reused by another process passes, so prefer
/// [`ProcessId::is_alive`] once the start time is known.
pub fn is_running(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    match read_stat(pid) {
        Stat::Gone => false,
        Stat::Unknown => true,
        Stat::Running { state, .. } => state != 'Z' && state != 'X',
    }
}

/// The start time of `pid`, if it runs.
pub fn start_time(pid: u32) -> Option<u64> {
    match read_stat(pid) {
        Stat::Running { start, .. } => Some(start),
        _ => None,
    }
}

/// What `/proc/PID/stat` says.
enum Stat {
    /// No such process.
    Gone,
    /// The file could not be read or parsed for another reason: we cannot tell.
    Unknown,
    /// Field 3 (state) and field 22 (start time).
    Running { state: char, start: u64 },
}

fn read_stat(pid: u32) -> Stat {
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        // Not in /proc: gone, unless /proc hides it (mounted with `hidepid=2` or `invisible`,
        // another user's process). kill(pid, 0) is not hidden: ESRCH means gone; success or
        // EPERM means the process is there.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(3) => {
            let Some(p) = rustix::process::Pid::from_raw(pid as i32) else { return Stat::Gone };
            return match rustix::process::test_kill_process(p) {
                Err(rustix::io::Errno::SRCH) => Stat::Gone,
                _ => Stat::Unknown,
            };
        }
        Err(_) => return Stat::Unknown,
    };
    // The command name (field 2) is in parentheses and may contain spaces or ')': split after
    // the last ')'. Then field 3 is the state and field 22 the start time.
    let parsed = (|| {
        let rest = &stat[stat.rfind(')')? + 1..];
        let mut fields = rest.split_ascii_whitespace();
        let state = fields.next()?.chars().next()?;
        let start = fields.nth(18)?.parse().ok()?;
        Some(Stat::Running { state, start })
    })();
    parsed.unwrap_or(Stat::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_is_alive_and_fakes_are_not() {
        let me = ProcessId::current();
        assert!(me.start_time > 0);
        assert!(me.is_alive());
        assert!(!ProcessId { start_time: me.start_time + 1, ..me }.is_alive());
        assert!(!ProcessId { pid: 0, start_time: 0 }.is_alive());
        assert!(!ProcessId { pid: u32::MAX, start_time: 0 }.is_alive());
        assert!(is_running(me.pid));
        assert!(!is_running(0));
    }

    #[test]
    fn exited_child_is_dead() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!ProcessId { pid, start_time: start_time(pid).unwrap_or(1) }.is_alive());
    }
}
