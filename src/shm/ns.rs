//! A process's namespace identities, recorded in a ring for display: so that `gpuring stat`,
//! `doctor` and errors can say "this producer is in another pid namespace" instead of guessing
//! from a pid that means nothing across namespaces.

use std::fmt;

/// The namespaces of one process: the device of the namespace file system and the inode of
/// each namespace (`stat /proc/self/ns/{pid,net,ipc,mnt}`). All 0 where /proc could not tell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Namespaces {
    /// `st_dev` of the namespace files (the same for every namespace of a boot).
    pub dev: u64,
    /// Pid namespace inode.
    pub pid: u64,
    /// Network namespace inode.
    pub net: u64,
    /// IPC namespace inode.
    pub ipc: u64,
    /// Mount namespace inode.
    pub mnt: u64,
}

/// One namespace kind, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Process ids.
    Pid,
    /// Network: abstract unix sockets, loopback.
    Net,
    /// System V IPC (and, with a private /dev/shm mount, POSIX shm).
    Ipc,
    /// Mounts: which /dev/shm and which directories a process sees.
    Mnt,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Pid => "pid",
            Kind::Net => "network",
            Kind::Ipc => "IPC",
            Kind::Mnt => "mount",
        })
    }
}

impl Namespaces {
    /// This process's namespaces.
    pub fn current() -> Namespaces {
        let ino = |kind: &str| {
            rustix::fs::stat(format!("/proc/self/ns/{kind}")).map(|st| (st.st_dev, st.st_ino))
        };
        let (Ok(pid), Ok(net), Ok(ipc), Ok(mnt)) = (ino("pid"), ino("net"), ino("ipc"), ino("mnt"))
        else {
            return Namespaces::default();
        };
        Namespaces { dev: pid.0, pid: pid.1, net: net.1, ipc: ipc.1, mnt: mnt.1 }
    }

    /// Whether anything is known (not all 0).
    pub fn known(&self) -> bool {
        self.pid != 0
    }

    /// The kinds in which `self` and `other` differ; empty when either is unknown.
    pub fn differ(&self, other: &Namespaces) -> Vec<Kind> {
        if !self.known() || !other.known() || self.dev != other.dev {
            return Vec::new();
        }
        let pairs = [
            (Kind::Pid, self.pid, other.pid),
            (Kind::Net, self.net, other.net),
            (Kind::Ipc, self.ipc, other.ipc),
            (Kind::Mnt, self.mnt, other.mnt),
        ];
        pairs.into_iter().filter(|(_, a, b)| a != b).map(|(k, _, _)| k).collect()
    }

    /// As five words, in the order the segment stores them.
    pub fn to_words(self) -> [u64; 5] {
        [self.dev, self.pid, self.net, self.ipc, self.mnt]
    }

    /// From five words, as the segment stores them.
    pub fn from_words(w: [u64; 5]) -> Namespaces {
        Namespaces { dev: w[0], pid: w[1], net: w[2], ipc: w[3], mnt: w[4] }
    }
}

/// Whether this process's /proc belongs to another pid namespace than its own: `/proc/self`
/// names another pid than ours (a process started by `unshare --pid` without `--mount-proc`;
/// a container always mounts its own). The CUDA driver does not start then.
pub fn foreign_proc() -> bool {
    let ours = rustix::process::getpid().as_raw_nonzero().get();
    let seen = std::fs::read_link("/proc/self").ok();
    seen.is_some_and(|p| p.to_str().and_then(|s| s.parse::<i32>().ok()) != Some(ours))
}

/// "in another pid and network namespace", or "" when there is nothing to say.
pub fn describe(kinds: &[Kind]) -> String {
    match kinds {
        [] => String::new(),
        [one] => format!("in another {one} namespace"),
        [rest @ .., last] => {
            let rest: Vec<String> = rest.iter().map(Kind::to_string).collect();
            format!("in another {} and {last} namespace", rest.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_in_its_own_namespaces() {
        let me = Namespaces::current();
        assert!(me.known(), "/proc/self/ns is readable here");
        assert!(me.differ(&me).is_empty());
        let other = Namespaces { pid: me.pid + 1, net: me.net + 1, ..me };
        assert_eq!(me.differ(&other), vec![Kind::Pid, Kind::Net]);
        assert_eq!(describe(&me.differ(&other)), "in another pid and network namespace");
        assert!(me.differ(&Namespaces::default()).is_empty(), "unknown says nothing");
        assert_eq!(Namespaces::from_words(me.to_words()), me);
    }
}
