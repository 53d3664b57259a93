//! A small pipelined RESP2 client for the remote tier (F14): Redis and Redis Cluster, the few
//! commands a KV-page store needs (`SET ... NX PX`, `GET`, `EXISTS`, `DEL`), deadlines on every
//! socket operation, and values read straight into the caller's buffer.
//!
//! Why not the `redis` crate: its replies are owned `Value`s (a page's 2 MiB is read into a fresh
//! `Vec` and copied again), its cluster pipeline hides per-key errors behind one result, and it
//! brings its own retry policy; a page store needs each key's outcome, a bounded time per call,
//! and no copy beyond the socket's. This client speaks exactly that much RESP (std only).
//!
//! Cluster: slots from `CLUSTER SLOTS`, keys routed by CRC16 (no hash tags in kvcore's keys, so
//! every key is hashed whole), one pipeline per node; a `MOVED` reply refreshes the slot map and
//! the call reports that key as failed (the next call routes it right). A node that fails
//! (timeout, reset) fails only its own keys; its connection is dropped and re-opened on the next
//! call.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::error::{KvError, KvResult};

/// The outcome of one key's command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyResult {
    /// `SET`: stored; `GET`: found (its length); `EXISTS`/`DEL`: true.
    Done(usize),
    /// `SET NX`: the key existed (not rewritten); `GET`: missing; `EXISTS`/`DEL`: false.
    Absent,
    /// A reply of another length than the caller's buffer row (`GET`).
    WrongLength(usize),
    /// The server refused the command (`OOM`, `MOVED`, ...): its error line.
    Refused(String),
    /// The connection failed (timeout, reset, refused): the reason.
    Failed(String),
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

struct Node {
    addr: String,
    conn: Option<Conn>,
}

/// A client of one server or of a cluster.
pub struct RespClient {
    nodes: Vec<Node>,
    /// Cluster: slot -> node index (16384 entries); empty for a standalone server.
    slots: Vec<u16>,
    cluster: bool,
    timeout: Duration,
}

/// One command of a pipeline: its arguments, and where its reply goes.
enum Reply<'a> {
    /// Parse the reply as a status / integer / nil.
    Status,
    /// Read a bulk reply into this row of the caller's buffer.
    Into(&'a mut [u8]),
}

fn io_err(e: std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "timeout".into(),
        _ => format!("connection: {e}"),
    }
}

/// Commands per pipeline window for values of `size` bytes: about 16 MiB in flight, 1..=1024.
fn window_for(size: usize) -> usize {
    ((16 << 20) / size.max(1)).clamp(1, 1024)
}

/// CRC16-CCITT (XMODEM), Redis Cluster's key hash.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of a key (hash tags honoured, as the server does).
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

impl Conn {
    fn open(addr: &str, timeout: Duration) -> Result<Self, String> {
        let sock = addr
            .to_socket_addrs()
            .map_err(|e| format!("connection: {addr}: {e}"))?
            .next()
            .ok_or_else(|| format!("connection: {addr}: no address"))?;
        let stream = TcpStream::connect_timeout(&sock, timeout).map_err(io_err)?;
        stream.set_read_timeout(Some(timeout)).map_err(io_err)?;
        stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
        stream.set_nodelay(true).map_err(io_err)?;
        let read = stream.try_clone().map_err(io_err)?;
        Ok(Self {
            reader: BufReader::with_capacity(1 << 16, read),
            writer: BufWriter::with_capacity(1 << 16, stream),
        })
    }

    fn send(&mut self, args: &[&[u8]]) -> std::io::Result<()> {
        write!(self.writer, "*{}\r\n", args.len())?;
        for a in args {
            write!(self.writer, "${}\r\n", a.len())?;
            self.writer.write_all(a)?;
            self.writer.write_all(b"\r\n")?;
        }
        Ok(())
    }

    fn line(&mut self) -> Result<Vec<u8>, String> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line).map_err(io_err)?;
        if line.len() < 3 || !line.ends_with(b"\r\n") {
            return Err("connection: closed or malformed reply".into());
        }
        line.truncate(line.len() - 2);
        Ok(line)
    }

    fn int(text: &[u8]) -> Result<i64, String> {
        std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| "connection: malformed reply".to_string())
    }

    /// Read one reply. `Err` only for a broken connection (the pipeline's later replies are lost).
    fn reply(&mut self, into: &mut Reply<'_>) -> Result<KeyResult, String> {
        let line = self.line()?;
        let (kind, rest) = (line[0], &line[1..]);
        match kind {
            b'+' => Ok(KeyResult::Done(0)),
            b'-' => Ok(KeyResult::Refused(
                String::from_utf8_lossy(rest).into_owned(),
            )),
            b':' => Ok(match Self::int(rest)? {
                0 => KeyResult::Absent,
                n => KeyResult::Done(n as usize),
            }),
            b'$' => {
                let n = Self::int(rest)?;
                if n < 0 {
                    return Ok(KeyResult::Absent);
                }
                let n = n as usize;
                let result = match into {
                    Reply::Into(row) if row.len() == n => {
                        self.reader.read_exact(row).map_err(io_err)?;
                        KeyResult::Done(n)
                    }
                    _ => {
                        // Not the caller's size (or a status command): read past it.
                        std::io::copy(&mut (&mut self.reader).take(n as u64), &mut std::io::sink())
                            .map_err(io_err)?;
                        match into {
                            Reply::Into(_) => KeyResult::WrongLength(n),
                            Reply::Status => KeyResult::Done(n),
                        }
                    }
                };
                let mut crlf = [0u8; 2];
                self.reader.read_exact(&mut crlf).map_err(io_err)?;
                Ok(result)
            }
            b'*' => {
                // Arrays only answer CLUSTER SLOTS, read elsewhere.
                Err("connection: unexpected array reply".into())
            }
            _ => Err("connection: malformed reply".into()),
        }
    }
}

impl RespClient {
    /// Connect to `nodes` ("host:port"): one standalone server, or (`cluster`) any nodes of a
    /// cluster, whose slot map is read at once. `timeout` bounds every connect, read and write.
    pub fn connect(nodes: &[String], cluster: bool, timeout: Duration) -> KvResult<Self> {
        if nodes.is_empty() || (!cluster && nodes.len() != 1) {
            return Err(KvError::InvalidArgument(
                "a standalone server takes one address, a cluster at least one".into(),
            ));
        }
        if timeout.is_zero() {
            return Err(KvError::InvalidArgument("timeout must be > 0".into()));
        }
        let mut client = Self {
            nodes: nodes
                .iter()
                .map(|a| Node {
                    addr: a.clone(),
                    conn: None,
                })
                .collect(),
            slots: Vec::new(),
            cluster,
            timeout,
        };
        if cluster {
            client.refresh_slots().map_err(KvError::InvalidArgument)?;
        }
        Ok(client)
    }

    /// Read `CLUSTER SLOTS` from the first node that answers and rebuild the slot map (new
    /// nodes are added).
    fn refresh_slots(&mut self) -> Result<(), String> {
        self.refresh_slots_avoiding(&[])
    }

    /// [`refresh_slots`](Self::refresh_slots), asking first the nodes not in `avoid` (nodes
    /// that just failed: a dead master's connect timeout is paid last, if at all).
    fn refresh_slots_avoiding(&mut self, avoid: &[usize]) -> Result<(), String> {
        let mut last = String::from("no node answered");
        let order: Vec<usize> = (0..self.nodes.len())
            .filter(|i| !avoid.contains(i))
            .chain(avoid.iter().copied())
            .collect();
        for i in order {
            match self.slots_from(i) {
                Ok(ranges) => {
                    let mut slots = vec![u16::MAX; 16384];
                    for (lo, hi, addr) in ranges {
                        let idx = match self.nodes.iter().position(|n| n.addr == addr) {
                            Some(idx) => idx,
                            None => {
                                self.nodes.push(Node { addr, conn: None });
                                self.nodes.len() - 1
                            }
                        };
                        for slot in slots.iter_mut().take(hi.min(16383) + 1).skip(lo) {
                            *slot = idx as u16;
                        }
                    }
                    self.slots = slots;
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(format!("cluster slots: {last}"))
    }

    fn slots_from(&mut self, i: usize) -> Result<Vec<(usize, usize, String)>, String> {
        let conn = self.conn(i)?;
        conn.send(&[b"CLUSTER", b"SLOTS"]).map_err(io_err)?;
        conn.writer.flush().map_err(io_err)?;
        let head = conn.line()?;
        if head.first() != Some(&b'*') {
            return Err(String::from_utf8_lossy(&head).into_owned());
        }
        let n = Conn::int(&head[1..])?;
        let mut out = Vec::new();
        for _ in 0..n {
            let entry = conn.line()?;
            let parts = Conn::int(&entry[1..])?;
            let lo = Conn::int(&conn.line()?[1..])? as usize;
            let hi = Conn::int(&conn.line()?[1..])? as usize;
            let mut addr = None;
            for p in 2..parts {
                // Each node: *N, $ip, :port, [$id, ...]
                let node = conn.line()?;
                let fields = Conn::int(&node[1..])?;
                let mut ip = String::new();
                let mut port = 0;
                for f in 0..fields {
                    let h = conn.line()?;
                    match h[0] {
                        b'$' => {
                            let len = Conn::int(&h[1..])?;
                            let mut buf = vec![0; len.max(0) as usize + 2];
                            conn.reader.read_exact(&mut buf).map_err(io_err)?;
                            if f == 0 {
                                ip = String::from_utf8_lossy(&buf[..buf.len() - 2]).into_owned();
                            }
                        }
                        b':' if f == 1 => port = Conn::int(&h[1..])?,
                        b'*' => {
                            // Metadata map (Redis 7): skip its elements' lines.
                            let m = Conn::int(&h[1..])?;
                            for _ in 0..m {
                                let e = conn.line()?;
                                if e[0] == b'$' {
                                    let len = Conn::int(&e[1..])?;
                                    let mut buf = vec![0; len.max(0) as usize + 2];
                                    conn.reader.read_exact(&mut buf).map_err(io_err)?;
                                }
                            }
                        }
                        _ => {}
                    }
                }
                if p == 2 {
                    addr = Some(format!("{ip}:{port}"));
                }
            }
            if let Some(addr) = addr {
                out.push((lo, hi, addr));
            }
        }
        Ok(out)
    }

    fn conn(&mut self, i: usize) -> Result<&mut Conn, String> {
        let node = &mut self.nodes[i];
        if node.conn.is_none() {
            node.conn = Some(Conn::open(&node.addr, self.timeout)?);
        }
        node.conn
            .as_mut()
            .ok_or_else(|| "connection: not open".to_string())
    }

    fn node_of(&self, key: &[u8]) -> Option<usize> {
        if !self.cluster {
            return Some(0);
        }
        let idx = *self.slots.get(key_slot(key) as usize)?;
        (idx != u16::MAX).then_some(idx as usize)
    }

    /// Run one command per key (`args(i)` builds key `i`'s arguments), pipelined per node in
    /// windows of `window` commands (bounding the bytes a server buffers for this client: a
    /// pipeline of a thousand 2 MiB GETs runs at a third of the speed of windows of eight);
    /// `into(i)` says where key `i`'s reply goes. One result per key.
    fn run<'b>(
        &mut self,
        keys: &[&[u8]],
        window: usize,
        args: impl Fn(usize) -> Vec<&'b [u8]>,
        mut into: Vec<Reply<'_>>,
    ) -> Vec<KeyResult> {
        let mut out = vec![KeyResult::Failed("not sent".into()); keys.len()];
        let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for (i, key) in keys.iter().enumerate() {
            match self.node_of(key) {
                Some(n) => by_node[n].push(i),
                None => out[i] = KeyResult::Failed("cluster: slot not served".into()),
            }
        }
        let mut moved = false;
        let windows: Vec<(usize, &[usize])> = by_node
            .iter()
            .enumerate()
            .flat_map(|(n, idx)| idx.chunks(window.max(1)).map(move |w| (n, w)))
            .collect();
        // A node that failed once in this call fails its later windows at once: a dead node
        // costs one timeout per call, not one per window.
        let mut dead: Vec<Option<String>> = vec![None; self.nodes.len()];
        for (n, idx) in windows {
            if let Some(e) = &dead[n] {
                for &i in idx {
                    out[i] = KeyResult::Failed(e.clone());
                }
                continue;
            }
            let sent = self.conn(n).and_then(|c| {
                for &i in idx {
                    c.send(&args(i)).map_err(io_err)?;
                }
                c.writer.flush().map_err(io_err)
            });
            if let Err(e) = sent {
                self.nodes[n].conn = None;
                for &i in idx {
                    out[i] = KeyResult::Failed(e.clone());
                }
                dead[n] = Some(e);
                continue;
            }
            for (k, &i) in idx.iter().enumerate() {
                let got = match self.nodes[n].conn.as_mut() {
                    Some(c) => c.reply(&mut into[i]),
                    None => Err("connection: lost".into()),
                };
                match got {
                    Ok(r) => {
                        if matches!(&r, KeyResult::Refused(e) if e.starts_with("MOVED") || e.starts_with("ASK"))
                        {
                            moved = true;
                        }
                        out[i] = r;
                    }
                    Err(e) => {
                        // The stream is out of step: every later reply of this node is lost.
                        self.nodes[n].conn = None;
                        for &j in &idx[k..] {
                            out[j] = KeyResult::Failed(e.clone());
                        }
                        dead[n] = Some(e);
                        break;
                    }
                }
            }
        }
        // A MOVED or ASK, or a node that failed (a master killed: its replica may be promoted, and
        // a dead node never answers MOVED): the next call uses the cluster's map as it is now.
        let failed: Vec<usize> = (0..dead.len()).filter(|&n| dead[n].is_some()).collect();
        if (moved || !failed.is_empty()) && self.cluster {
            let _ = self.refresh_slots_avoiding(&failed);
        }
        out
    }

    /// `SET key value [NX] [PX ttl]` for each pair, pipelined per node.
    pub fn set_many(
        &mut self,
        keys: &[&[u8]],
        values: &[&[u8]],
        nx: bool,
        px_ms: Option<u64>,
    ) -> Vec<KeyResult> {
        let px = px_ms
            .map(|p| p.to_string().into_bytes())
            .unwrap_or_default();
        let into = keys.iter().map(|_| Reply::Status).collect();
        let size = values.iter().map(|v| v.len()).max().unwrap_or(0);
        self.run(
            keys,
            window_for(size),
            |i| {
                let mut a: Vec<&[u8]> = vec![b"SET", keys[i], values[i]];
                if nx {
                    a.push(b"NX");
                }
                if px_ms.is_some() {
                    a.push(b"PX");
                    a.push(&px);
                }
                a
            },
            into,
        )
    }

    /// `GET` each key into its row of `out` (`keys.len()` rows of `out.len() / keys.len()`
    /// bytes): a value of another length is reported (`WrongLength`), not copied.
    pub fn get_into(&mut self, keys: &[&[u8]], out: &mut [u8]) -> Vec<KeyResult> {
        if keys.is_empty() {
            return Vec::new();
        }
        let row = out.len() / keys.len();
        let into = if row == 0 {
            // Zero-width rows (chunks_exact_mut(0) panics): only empty values fit.
            (0..keys.len()).map(|_| Reply::Into(&mut [])).collect()
        } else {
            out.chunks_exact_mut(row).map(Reply::Into).collect()
        };
        self.run(keys, window_for(row), |i| vec![b"GET", keys[i]], into)
    }

    /// `EXISTS` each key.
    pub fn exists_many(&mut self, keys: &[&[u8]]) -> Vec<KeyResult> {
        let into = keys.iter().map(|_| Reply::Status).collect();
        self.run(keys, 1024, |i| vec![b"EXISTS", keys[i]], into)
    }

    /// `DEL` each key.
    pub fn del_many(&mut self, keys: &[&[u8]]) -> Vec<KeyResult> {
        let into = keys.iter().map(|_| Reply::Status).collect();
        self.run(keys, 1024, |i| vec![b"DEL", keys[i]], into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_match_the_redis_reference() {
        // From the Redis Cluster specification: CRC16("123456789") = 0x31C3.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    }
}
