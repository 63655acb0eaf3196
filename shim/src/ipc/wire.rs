//! The conversation between an importing and an exporting process: a Unix domain socket
//! (`SOCK_SEQPACKET`, so every message arrives whole) in the abstract namespace, named from
//! the exporter's uid and pid, over which the exporter passes the units' file descriptors
//! (`SCM_RIGHTS`).
//!
//! Why a socket: the descriptors are the driver's own files, which only passing them
//! keeps (`/proc/PID/fd/N` would open the path anew, not the driver's file), and
//! `pidfd_getfd` needs ptrace rights over the exporter, which Yama's `ptrace_scope=1`
//! denies between sibling processes (two workers of one job). The abstract namespace
//! needs no file to clean up after a crash: the name goes with the process. It has no
//! permissions either, so the exporter serves only peers of its own uid (`SO_PEERCRED`).
//!
//! The conversation: the importer connects and sends the 64 handle bytes; the exporter
//! answers with a [`Reply`] and, if it is `CUDA_SUCCESS`, the units in batches of at most
//! [`UNITS_PER_MESSAGE`] (each a [`UnitBatch`] with its descriptors). The connection then
//! stays open for as long as the importer has the memory open: its end (the importer's
//! `cuIpcCloseMemHandle`, or its death) tells the exporter the import is over.
//!
//! Not here: what the exporter or importer does with the memory.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use tensile_driver_abi::CUresult;

/// Descriptors per message: well under the kernel's limit of 253 (`SCM_MAX_FD`).
pub const UNITS_PER_MESSAGE: usize = 64;

/// The largest message either side sends: a batch of units.
pub const MAX_MESSAGE: usize = 8 + 16 * UNITS_PER_MESSAGE;

/// This process's uid: an exporter serves only peers of its own uid, and an importer looks
/// for exporters of its own.
pub fn own_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// The socket name of the exporter that is process `pid` of this user (in the abstract
/// namespace).
pub fn socket_name(pid: u32) -> String {
    format!("tensile-ipc-{}-{pid}", own_uid())
}

fn last_error() -> io::Error {
    io::Error::last_os_error()
}

/// The abstract address `name`, and its length.
fn address(name: &str) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: an all-zero `sockaddr_un` is valid (an empty path).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    // The leading NUL of `sun_path` makes the name abstract.
    if bytes.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    for (dst, &b) in addr.sun_path[1..].iter_mut().zip(bytes) {
        *dst = b as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + bytes.len();
    Ok((addr, len as libc::socklen_t))
}

fn seqpacket_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain arguments; a new descriptor or -1.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A listening socket at `name`.
pub fn listen(name: &str) -> io::Result<OwnedFd> {
    let sock = seqpacket_socket()?;
    let (addr, len) = address(name)?;
    // SAFETY: a valid socket and a valid address of `len` bytes.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if rc != 0 {
        return Err(last_error());
    }
    // SAFETY: a valid, bound socket.
    if unsafe { libc::listen(sock.as_raw_fd(), 64) } != 0 {
        return Err(last_error());
    }
    Ok(sock)
}

/// The next connection waiting on `listener`.
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: a valid listening socket; the peer's address is not asked for.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets both timeouts of `sock`: a blocked send or receive fails after `timeout`.
pub fn set_timeouts(sock: BorrowedFd<'_>, timeout: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: a valid socket and a `timeval` of the size given.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(last_error());
        }
    }
    Ok(())
}

/// A connection to the socket `name`, with `timeout` on every send and receive.
pub fn connect(name: &str, timeout: Duration) -> io::Result<OwnedFd> {
    let sock = seqpacket_socket()?;
    set_timeouts(sock.as_fd(), timeout)?;
    let (addr, len) = address(name)?;
    // SAFETY: a valid socket and a valid address of `len` bytes.
    let rc = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if rc != 0 {
        return Err(last_error());
    }
    Ok(sock)
}

/// The uid of the process at the other end of `sock`.
pub fn peer_uid(sock: BorrowedFd<'_>) -> io::Result<u32> {
    // SAFETY: an all-zero `ucred` is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket and a `ucred` of the size given.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(last_error());
    }
    Ok(cred.uid)
}

/// Room for the control message of `n` descriptors, 8-byte aligned as `cmsghdr` needs.
fn control_buffer(n: usize) -> Vec<u64> {
    // SAFETY: CMSG_SPACE only computes a size.
    let bytes = unsafe { libc::CMSG_SPACE((n * size_of::<i32>()) as u32) } as usize;
    vec![0u64; bytes.div_ceil(8).max(1)]
}

/// Sends `bytes` as one message, with `fds` passed along (none: a plain message).
pub fn send(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero `msghdr` is valid (no name, no data, no control).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let mut control = control_buffer(fds.len());
    if !fds.is_empty() {
        let data_len = (fds.len() * size_of::<i32>()) as u32;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE only computes a size.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(data_len) } as _;
        // SAFETY: `msg` has a control buffer of `msg_controllen` bytes, room for one header
        // and `fds.len()` descriptors, so the first header and its data lie inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as _;
            let data = libc::CMSG_DATA(cmsg).cast::<i32>();
            for (i, fd) in fds.iter().enumerate() {
                data.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    // SAFETY: `msg` points to live buffers (`iov`, `bytes`, `control`) for the call; no
    // SIGPIPE if the peer is gone.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(last_error());
    }
    if n as usize != bytes.len() {
        return Err(io::Error::from(io::ErrorKind::WriteZero));
    }
    Ok(())
}

/// Receives one message into `buf`, with up to `max_fds` descriptors passed along. Returns
/// its length (0: the peer closed the connection) and the descriptors, each owned (and
/// close-on-exec).
pub fn recv(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero `msghdr` is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let mut control = control_buffer(max_fds);
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = (control.len() * 8) as _;
    // SAFETY: `msg` points to live buffers of the lengths it states.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(last_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg`'s control buffer; CMSG_FIRSTHDR/NXTHDR walk only the
    // headers inside `msg_controllen`, and each SCM_RIGHTS header's data holds
    // `(cmsg_len - CMSG_LEN(0)) / 4` descriptors, new ones that this process now owns.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data_len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(cmsg).cast::<i32>();
                for i in 0..data_len / size_of::<i32>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0 {
        // What did come is closed with `fds`.
        return Err(io::Error::from(io::ErrorKind::InvalidData));
    }
    Ok((n as usize, fds))
}

/// The exporter's answer to a request: the outcome, and what the units will map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// `CUDA_SUCCESS`, or the error the importer's `cuIpcOpenMemHandle` returns.
    pub status: CUresult,
    /// Units that follow, in batches.
    pub units: u32,
    /// Bytes the units cover, back to back.
    pub span_bytes: u64,
    /// Where the allocation starts in the span.
    pub offset: u64,
    /// The allocation's size.
    pub size: u64,
}

impl Reply {
    pub const BYTES: usize = 32;

    pub fn refusal(status: CUresult) -> Reply {
        Reply {
            status,
            units: 0,
            span_bytes: 0,
            offset: 0,
            size: 0,
        }
    }

    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..4].copy_from_slice(&self.status.to_le_bytes());
        b[4..8].copy_from_slice(&self.units.to_le_bytes());
        b[8..16].copy_from_slice(&self.span_bytes.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Reply> {
        (b.len() == Self::BYTES).then(|| Reply {
            status: u32_le(&b[0..4]),
            units: u32_le(&b[4..8]),
            span_bytes: u64_le(&b[8..16]),
            offset: u64_le(&b[16..24]),
            size: u64_le(&b[24..32]),
        })
    }
}

/// One unit of an export: `bytes` mapped at `offset` of the span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitPlace {
    pub offset: u64,
    pub bytes: u64,
}

/// A batch of units, sent with their descriptors in the same order.
pub struct UnitBatch;

impl UnitBatch {
    pub fn encode(units: &[UnitPlace]) -> Vec<u8> {
        let mut b = Vec::with_capacity(8 + 16 * units.len());
        b.extend_from_slice(&(units.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        for u in units {
            b.extend_from_slice(&u.offset.to_le_bytes());
            b.extend_from_slice(&u.bytes.to_le_bytes());
        }
        b
    }

    pub fn decode(b: &[u8]) -> Option<Vec<UnitPlace>> {
        if b.len() < 8 {
            return None;
        }
        let n = u32_le(&b[0..4]) as usize;
        if b.len() != 8 + 16 * n {
            return None;
        }
        Some(
            b[8..]
                .chunks_exact(16)
                .map(|c| UnitPlace {
                    offset: u64_le(&c[0..8]),
                    bytes: u64_le(&c[8..16]),
                })
                .collect(),
        )
    }
}

fn u32_le(b: &[u8]) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(b);
    u32::from_le_bytes(v)
}

fn u64_le(b: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(b);
    u64::from_le_bytes(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_back_as_written() {
        let r = Reply {
            status: 0,
            units: 3,
            span_bytes: 6 << 20,
            offset: 4096,
            size: 5 << 20,
        };
        assert_eq!(Reply::decode(&r.encode()), Some(r));
        assert_eq!(Reply::decode(&[0u8; 31]), None);
        let units = [
            UnitPlace {
                offset: 0,
                bytes: 2 << 20,
            },
            UnitPlace {
                offset: 2 << 20,
                bytes: 4 << 20,
            },
        ];
        assert_eq!(
            UnitBatch::decode(&UnitBatch::encode(&units)).as_deref(),
            Some(&units[..])
        );
        assert_eq!(UnitBatch::decode(&[1, 0, 0, 0, 0, 0, 0, 0]), None);
    }

    #[test]
    fn descriptors_pass_over_an_abstract_socket_to_a_peer_of_the_same_uid() {
        let name = format!(
            "tensile-ipc-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        );
        let listener = listen(&name).unwrap();
        let client = connect(&name, Duration::from_secs(5)).unwrap();
        let server = accept(listener.as_fd()).unwrap();
        assert_eq!(peer_uid(server.as_fd()).unwrap(), own_uid());
        // A pipe's write end travels; what is written through the copy arrives at the read end.
        let mut ends = [0i32; 2];
        // SAFETY: a valid array of two descriptors.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors nothing else owns.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        send(server.as_fd(), b"hello", &[write_end.as_fd()]).unwrap();
        drop(write_end);
        let mut buf = [0u8; MAX_MESSAGE];
        let (n, fds) = recv(client.as_fd(), &mut buf, 4).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        // SAFETY: a valid descriptor and a one-byte buffer.
        let wrote = unsafe { libc::write(fds[0].as_raw_fd(), b"x".as_ptr().cast(), 1) };
        assert_eq!(wrote, 1);
        let mut got = [0u8; 1];
        // SAFETY: a valid descriptor and a one-byte buffer.
        let read = unsafe { libc::read(read_end.as_raw_fd(), got.as_mut_ptr().cast(), 1) };
        assert_eq!(read, 1);
        assert_eq!(&got, b"x");
        // The server's end closing reads as an empty message.
        drop(server);
        let (n, fds) = recv(client.as_fd(), &mut buf, 4).unwrap();
        assert_eq!((n, fds.len()), (0, 0));
        // Nobody listens once the listener is gone.
        drop(listener);
        assert!(connect(&name, Duration::from_secs(1)).is_err());
    }
}
