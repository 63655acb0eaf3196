//! Reading kernel signatures out of PTX text.
//!
//! A `.entry` declares every parameter's type, array length and alignment, which is all the
//! driver needs to lay the parameter buffer out (each parameter at the next offset aligned to
//! its alignment). The simulated GPU answers `cuKernelGetParamInfo` from this, exactly as the
//! real driver does from the compiled image. This is a parser for the directive headers only:
//! it does not understand instructions and does not validate the kernel bodies.

use std::fmt;

/// One parameter's place in the parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamSlot {
    pub offset: u32,
    pub size: u32,
    pub align: u32,
}

/// A kernel entry point and its parameter layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySignature {
    pub name: String,
    pub params: Vec<ParamSlot>,
}

impl EntrySignature {
    /// Bytes of the whole parameter buffer (end of the last parameter).
    pub fn param_bytes(&self) -> u32 {
        self.params.last().map_or(0, |p| p.offset + p.size)
    }
}

/// Why PTX text could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxError {
    /// The entry being parsed, when known.
    pub entry: Option<String>,
    pub message: String,
}

impl fmt::Display for PtxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.entry {
            Some(e) => write!(f, "malformed PTX in .entry {e}: {}", self.message),
            None => write!(f, "malformed PTX: {}", self.message),
        }
    }
}

impl std::error::Error for PtxError {}

fn err(entry: Option<&str>, message: impl Into<String>) -> PtxError {
    PtxError {
        entry: entry.map(str::to_owned),
        message: message.into(),
    }
}

/// The `.version major.minor` directive, if present and well formed.
pub fn ptx_version(ptx: &str) -> Option<(u32, u32)> {
    let text = strip_comments(ptx);
    let mut tokens = text.split_whitespace();
    while let Some(t) = tokens.next() {
        if t == ".version" {
            let (major, minor) = tokens.next()?.split_once('.')?;
            return Some((major.parse().ok()?, minor.parse().ok()?));
        }
    }
    None
}

/// The first target of the `.target` directive (e.g. `sm_90`), if present.
pub fn ptx_target(ptx: &str) -> Option<String> {
    let text = strip_comments(ptx);
    let mut tokens = text.split_whitespace();
    while let Some(t) = tokens.next() {
        if t == ".target" {
            return tokens.next().map(|s| s.trim_end_matches(',').to_owned());
        }
    }
    None
}

/// Every `.entry` of `ptx`, in order of appearance.
pub fn parse_entries(ptx: &str) -> Result<Vec<EntrySignature>, PtxError> {
    let text = strip_comments(ptx);
    let mut entries: Vec<EntrySignature> = Vec::new();
    let mut rest = text.as_str();
    while let Some(pos) = find_directive(rest, ".entry") {
        rest = &rest[pos + ".entry".len()..];
        let after = rest.trim_start();
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '%')))
            .unwrap_or(after.len());
        if name_len == 0 {
            return Err(err(None, ".entry without a name"));
        }
        let name = &after[..name_len];
        let body = after[name_len..].trim_start();
        let params = if let Some(list) = body.strip_prefix('(') {
            let close = list
                .find(')')
                .ok_or_else(|| err(Some(name), "unclosed parameter list"))?;
            rest = &list[close + 1..];
            parse_param_list(name, &list[..close])?
        } else {
            rest = body;
            Vec::new()
        };
        if entries.iter().any(|e| e.name == name) {
            return Err(err(Some(name), "entry declared twice"));
        }
        entries.push(EntrySignature {
            name: name.to_owned(),
            params,
        });
    }
    Ok(entries)
}

/// Position of `directive` as a whole token in `text`.
fn find_directive(text: &str, directive: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find(directive) {
        let at = from + i;
        let before_ok = at == 0 || text[..at].ends_with(|c: char| c.is_whitespace());
        let after_ok = text[at + directive.len()..].starts_with(|c: char| c.is_whitespace());
        if before_ok && after_ok {
            return Some(at);
        }
        from = at + directive.len();
    }
    None
}

fn parse_param_list(entry: &str, list: &str) -> Result<Vec<ParamSlot>, PtxError> {
    let mut params = Vec::new();
    let mut end = 0u32;
    if list.trim().is_empty() {
        return Ok(params);
    }
    for decl in list.split(',') {
        let (size, align) = parse_param(entry, decl)?;
        let offset = end
            .checked_next_multiple_of(align)
            .ok_or_else(|| err(Some(entry), "parameter buffer too large"))?;
        end = offset
            .checked_add(size)
            .ok_or_else(|| err(Some(entry), "parameter buffer too large"))?;
        params.push(ParamSlot {
            offset,
            size,
            align,
        });
    }
    Ok(params)
}

/// (size, alignment) of one `.param` declaration.
fn parse_param(entry: &str, decl: &str) -> Result<(u32, u32), PtxError> {
    let spaced = decl.replace('[', " [ ").replace(']', " ] ");
    let mut tokens = spaced.split_whitespace();
    if tokens.next() != Some(".param") {
        return Err(err(
            Some(entry),
            format!("expected .param in `{}`", decl.trim()),
        ));
    }
    let mut elem: Option<u32> = None;
    let mut align: Option<u32> = None;
    let mut count: u32 = 1;
    let mut is_ptr = false;
    let mut name_seen = false;
    while let Some(t) = tokens.next() {
        match t {
            ".align" => {
                let v: u32 = tokens
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|v: &u32| v.is_power_of_two())
                    .ok_or_else(|| err(Some(entry), format!("bad .align in `{}`", decl.trim())))?;
                // After `.ptr`, `.align` is the pointee's alignment, not the parameter's.
                if !is_ptr {
                    align = Some(v);
                }
            }
            ".ptr" => is_ptr = true,
            ".global" | ".const" | ".shared" | ".local" => {}
            "[" => {
                count = tokens
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n: &u32| n > 0)
                    .ok_or_else(|| err(Some(entry), format!("bad array in `{}`", decl.trim())))?;
                if tokens.next() != Some("]") {
                    return Err(err(
                        Some(entry),
                        format!("unclosed array in `{}`", decl.trim()),
                    ));
                }
            }
            t if t.starts_with('.') => {
                let size = type_size(t).ok_or_else(|| {
                    err(
                        Some(entry),
                        format!("unknown type {t} in `{}`", decl.trim()),
                    )
                })?;
                if elem.replace(size).is_some() {
                    return Err(err(Some(entry), format!("two types in `{}`", decl.trim())));
                }
            }
            _ if !name_seen => name_seen = true,
            t => {
                return Err(err(
                    Some(entry),
                    format!("unexpected `{t}` in `{}`", decl.trim()),
                ))
            }
        }
    }
    let elem = elem.ok_or_else(|| err(Some(entry), format!("no type in `{}`", decl.trim())))?;
    if !name_seen {
        return Err(err(Some(entry), format!("no name in `{}`", decl.trim())));
    }
    let size = elem
        .checked_mul(count)
        .ok_or_else(|| err(Some(entry), format!("array too large in `{}`", decl.trim())))?;
    Ok((size, align.unwrap_or(elem)))
}

fn type_size(t: &str) -> Option<u32> {
    Some(match t {
        ".b8" | ".u8" | ".s8" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        ".b128" => 16,
        _ => return None,
    })
}

/// Removes `//` and `/* */` comments (PTX has no string literals that could contain them).
fn strip_comments(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    let mut rest = ptx;
    loop {
        let line = rest.find("//");
        let block = rest.find("/*");
        match (line, block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                rest = rest[l..].find('\n').map_or("", |e| &rest[l + e..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                out.push(' ');
                rest = rest[b + 2..]
                    .find("*/")
                    .map_or("", |e| &rest[b + 2 + e + 2..]);
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(v: &[(u32, u32, u32)]) -> Vec<ParamSlot> {
        v.iter()
            .map(|&(offset, size, align)| ParamSlot {
                offset,
                size,
                align,
            })
            .collect()
    }

    #[test]
    fn nvrtc_output_is_laid_out_with_alignment() {
        let ptx = "
.version 9.0
.target sm_90
.address_size 64
	// .globl	axpy
.visible .entry axpy(
	.param .f32 axpy_param_0,
	.param .u64 axpy_param_1,
	.param .u64 axpy_param_2,
	.param .u64 axpy_param_3
)
{ ret; }
.visible .entry gather(
	.param .align 8 .b8 gather_param_0[40], .param .u32 gather_param_1,
	.param .u8 gather_param_2, .param .u16 gather_param_3
)
{ ret; }
.entry noargs()
{ ret; }
.entry bare
{ ret; }
/* .entry commented_out( .param .u64 x ) */
";
        let e = parse_entries(ptx).unwrap();
        assert_eq!(e.len(), 4);
        assert_eq!(e[0].name, "axpy");
        assert_eq!(
            e[0].params,
            slots(&[(0, 4, 4), (8, 8, 8), (16, 8, 8), (24, 8, 8)])
        );
        assert_eq!(e[0].param_bytes(), 32);
        assert_eq!(
            e[1].params,
            slots(&[(0, 40, 8), (40, 4, 4), (44, 1, 1), (46, 2, 2)])
        );
        assert_eq!(e[2].params, vec![]);
        assert_eq!(e[3].name, "bare");
        assert_eq!(ptx_version(ptx), Some((9, 0)));
        assert_eq!(ptx_target(ptx).as_deref(), Some("sm_90"));
    }

    #[test]
    fn pointer_attributes_do_not_change_the_layout() {
        let ptx = ".entry k(.param .u32 k_0, .param .u64 .ptr .global .align 16 k_1)\n{}";
        let e = parse_entries(ptx).unwrap();
        assert_eq!(e[0].params, slots(&[(0, 4, 4), (8, 8, 8)]));
    }

    #[test]
    fn committed_gather4_is_a_48_byte_struct() {
        let e = parse_entries(crate::PTX).unwrap();
        let g = e.iter().find(|e| e.name == "gather4").unwrap();
        assert_eq!(g.params, slots(&[(0, 48, 8)]));
        let m = e.iter().find(|e| e.name == "matmul_f32").unwrap();
        assert_eq!(
            m.params,
            slots(&[
                (0, 8, 8),
                (8, 8, 8),
                (16, 8, 8),
                (24, 4, 4),
                (28, 4, 4),
                (32, 4, 4)
            ])
        );
    }

    #[test]
    fn malformed_ptx_is_a_clear_error() {
        let cases = [
            (".entry k(.param .u64 a", "unclosed parameter list"),
            (".entry k(.param .q64 a)", "unknown type .q64"),
            (".entry k(.u64 a)", "expected .param"),
            (".entry k(.param .u64)", "no name"),
            (".entry k(.param .b8 a[])", "bad array"),
            (".entry k(.param .align 3 .b8 a[4])", "bad .align"),
            (".entry (.param .u64 a)", "without a name"),
            (".entry k() {} .entry k() {}", "declared twice"),
        ];
        for (ptx, want) in cases {
            let e = parse_entries(ptx).unwrap_err();
            assert!(e.to_string().contains(want), "{ptx}: {e}");
        }
    }

    #[test]
    fn missing_version_is_none() {
        assert_eq!(ptx_version(".target sm_90"), None);
        assert_eq!(ptx_version(".version 9.5\n"), Some((9, 5)));
    }
}
