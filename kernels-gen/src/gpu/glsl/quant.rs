//! The dequant device functions of [`crate::gpu::quant`] as GLSL, translated from the same C
//! text so that the two dialects cannot drift apart.
//!
//! Algorithm. The C bodies (and tables) use a small subset of C; [`translate`] rewrites it token
//! by token: a byte pointer (`const unsigned char* p`) becomes a `uint64_t` device address and
//! `p[i]` the byte load `aubier_b8(p + (i))` (an `int`, as C's integer promotion of an
//! `unsigned char`), so pointer arithmetic stays byte arithmetic; C casts `(T)x` become
//! constructors `T(x)`; a ternary whose condition is an integer gets `!= 0u`; `out + k` (the
//! destination array at an offset, passed to a helper) becomes the pair `dq, k`; `&x` (an
//! out-parameter) becomes `x`; `unsigned int` / `unsigned long long` / `signed char` become
//! `uint` / `uint64_t` / `int`; f32 locals are `precise` (no contraction). The few helpers
//! whose C leans on pointers to arrays or unions ([`helper`]) are written here by hand, each
//! the same operations as its C twin. Both texts are checked against gguf-py's blocks
//! (tests/kernels_vulkan.rs for this one, tests/kernels_quant.rs for the C).

use crate::gpu::quant::{parts, Helper};
use std::fmt::Write;

/// `aubier_dq16_<type>(uint64_t row, int c, out float dq[16])` with its helpers (each in an
/// `#ifndef` guard), or `None` for a type without a device function.
pub(super) fn device_fn(ggml_type: &str) -> Option<String> {
    let p = parts(ggml_type)?;
    let mut t = String::new();
    for h in &p.helpers {
        let guard = h.guard();
        let _ = write!(
            t,
            "#ifndef {guard}\n#define {guard}\n{}#endif\n",
            helper(*h)
        );
    }
    let _ = writeln!(t, "/* {ggml_type}: {} */", p.layout);
    let _ = writeln!(
        t,
        "void aubier_dq16_{}(uint64_t row, int c, out precise float dq[16]) {{",
        ggml_type.to_ascii_lowercase()
    );
    t.push_str(&translate(&p.body));
    t.push_str("}\n");
    Some(t)
}

/// The lookup tables of `ggml_type` (in `#ifndef` guards), or `None` for a type without a
/// device function. They are globals with a constant initializer but not `const`: glslang
/// copies a dynamically indexed `const` array into a function variable at every use, which
/// lavapipe's LLVM compiles three to four times slower (IQ1_S: ~4 min instead of ~1 min).
pub(super) fn device_tables(ggml_type: &str) -> Option<String> {
    Some(translate(&parts(ggml_type)?.tables))
}

/// The GLSL twin of a C helper of [`crate::gpu::quant`].
fn helper(h: Helper) -> &'static str {
    match h {
        Helper::AsF32 => "float aubier_as_f32(uint u) { return uintBitsToFloat(u); }\n",
        Helper::Bytes => {
            "uint aubier_u16(uint64_t p) { return uint(aubier_b8(p)) | (uint(aubier_b8(p + 1)) << 8); }
uint aubier_u32(uint64_t p) {
  return uint(aubier_b8(p)) | (uint(aubier_b8(p + 1)) << 8) | (uint(aubier_b8(p + 2)) << 16) |
         (uint(aubier_b8(p + 3)) << 24);
}
int aubier_i8(uint x) { return int(x ^ 0x80u) - 128; }
"
        }
        Helper::F16 => {
            "float aubier_f16_bits(uint h) {
  const uint sign = (h & 0x8000u) << 16;
  const uint em = h & 0x7fffu;
  if (em < 0x0400u) {
    precise const float v = float(em) * 5.9604644775390625e-8f;
    return sign != 0u ? -v : v;
  }
  uint mag = (em << 13) + 0x38000000u;
  if (em >= 0x7c00u) {
    mag = 0x7f800000u | ((em & 0x03ffu) << 13) | (em > 0x7c00u ? 0x00400000u : 0u);
  }
  return aubier_as_f32(mag | sign);
}
float aubier_f16(uint64_t p) { return aubier_f16_bits(aubier_u16(p)); }
"
        }
        Helper::PutSigned => {
            "void aubier_put_signed(inout precise float y[16], int at, int n, float db, uint64_t grid,
                       uint signs) {
  for (int j = 0; j < n; ++j) {
    precise const float v = db * float(uint((grid >> (8 * j)) & 0xfful));
    y[at + j] = ((signs >> j) & 1u) != 0u ? -v : v;
  }
}
"
        }
        Helper::IqScale => {
            "float aubier_iq_db(float d, uint s, float k) {
  precise const float r = d * (0.5f + float(s)) * k;
  return r;
}
"
        }
        Helper::PutIq1 => {
            "void aubier_put_iq1(inout precise float y[16], int at, float dl, uint64_t grid, float delta) {
  for (int j = 0; j < 8; ++j) {
    y[at + j] = dl * (float(aubier_i8(uint((grid >> (8 * j)) & 0xfful))) + delta);
  }
}
"
        }
        Helper::ScaleMinK4 => {
            "void aubier_scale_min_k4(int j, uint64_t q, out uint sc, out uint m) {
  if (j < 4) {
    sc = aubier_b8(q + j) & 63u;
    m = aubier_b8(q + (j + 4)) & 63u;
  } else {
    sc = (aubier_b8(q + (j + 4)) & 15u) | (uint(aubier_b8(q + (j - 4)) >> 6) << 4);
    m = (uint(aubier_b8(q + (j + 4))) >> 4) | (uint(aubier_b8(q + j) >> 6) << 4);
  }
}
"
        }
        Helper::Q3kScale => {
            "int aubier_q3k_scale(uint64_t s, int j) {
  const uint lo = (uint(aubier_b8(s + (j & 7))) >> (4 * (j >> 3))) & 15u;
  const uint hi = (uint(aubier_b8(s + (8 + (j & 3)))) >> (2 * (j >> 2))) & 3u;
  return int(lo | (hi << 4)) - 32;
}
"
        }
    }
}

/// A token with the whitespace (and comments) before it.
#[derive(Clone, Debug, PartialEq)]
struct Tok {
    ws: String,
    text: String,
}

impl Tok {
    fn new(text: &str) -> Tok {
        Tok {
            ws: String::new(),
            text: text.to_string(),
        }
    }

    fn spaced(text: &str) -> Tok {
        Tok {
            ws: " ".to_string(),
            text: text.to_string(),
        }
    }

    fn is(&self, s: &str) -> bool {
        self.text == s
    }

    fn ident(&self) -> bool {
        self.text
            .starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
    }

    fn number(&self) -> bool {
        self.text.starts_with(|c: char| c.is_ascii_digit())
    }
}

/// Splits C text into tokens; preprocessor lines and comments ride in the whitespace.
fn lex(src: &str) -> Vec<Tok> {
    const OPS: [&str; 14] = [
        "<<=", ">>=", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "++", "+=", "-=", "*=",
    ];
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut ws = String::new();
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        let c = b[i] as char;
        let at_line_start = i == 0 || b[i - 1] == b'\n';
        if c.is_ascii_whitespace() {
            ws.push(c);
            i += 1;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
            ws.push_str(&rest[..end]);
            i += end;
        } else if c == '#' && at_line_start {
            let end = rest.find('\n').map_or(rest.len(), |e| e + 1);
            ws.push_str(&rest[..end]);
            i += end;
        } else {
            let len = if c.is_ascii_alphanumeric() || c == '_' {
                // Identifiers and numbers (with a fraction, exponent and suffix).
                let mut j = 0;
                let bytes = rest.as_bytes();
                while j < bytes.len() {
                    let d = bytes[j] as char;
                    let exp_sign = (d == '-' || d == '+')
                        && j > 0
                        && c.is_ascii_digit()
                        && !rest.starts_with("0x")
                        && matches!(bytes[j - 1], b'e' | b'E');
                    if d.is_ascii_alphanumeric()
                        || d == '_'
                        || (d == '.' && c.is_ascii_digit())
                        || exp_sign
                    {
                        j += 1;
                    } else {
                        break;
                    }
                }
                j
            } else {
                OPS.iter()
                    .find(|op| rest.starts_with(*op))
                    .map_or(1, |op| op.len())
            };
            out.push(Tok {
                ws: std::mem::take(&mut ws),
                text: rest[..len].to_string(),
            });
            i += len;
        }
    }
    out.push(Tok {
        ws,
        text: String::new(),
    });
    out
}

/// The index of the bracket closing the one at `open` (`(`/`)` or `[`/`]`).
fn closing(t: &[Tok], open: usize) -> usize {
    let (o, c) = if t[open].is("(") {
        ("(", ")")
    } else {
        ("[", "]")
    };
    let mut depth = 0;
    for (i, tok) in t.iter().enumerate().skip(open) {
        if tok.is(o) {
            depth += 1;
        } else if tok.is(c) {
            depth -= 1;
            if depth == 0 {
                return i;
            }
        }
    }
    t.len() - 1
}

/// The end (exclusive) of the operand starting at `i`: a bracketed group, or a name or number
/// with its call and index suffixes.
fn operand_end(t: &[Tok], i: usize) -> usize {
    let mut j = if t[i].is("(") {
        closing(t, i) + 1
    } else {
        i + 1
    };
    while j < t.len() && (t[j].is("(") || t[j].is("[")) && !t[i].is("(") {
        j = closing(t, j) + 1;
    }
    j
}

/// Replaces the multi-word C types by one GLSL token.
fn types(t: Vec<Tok>) -> Vec<Tok> {
    let mut out: Vec<Tok> = Vec::new();
    // The whitespace of dropped tokens, given to the next one kept.
    let mut pending: Option<String> = None;
    let mut i = 0;
    while i < t.len() {
        let words = |w: &[&str]| {
            w.iter()
                .enumerate()
                .all(|(k, s)| t.get(i + k).is_some_and(|x| x.is(s)))
        };
        // A byte pointer is a 64-bit device address.
        let (n, text) = if words(&["unsigned", "long", "long"]) || words(&["unsigned", "char", "*"])
        {
            (3, "uint64_t")
        } else if words(&["unsigned", "int"]) || words(&["unsigned", "char"]) {
            (2, "uint")
        } else if words(&["signed", "char"]) {
            (2, "int")
        } else if t[i].is("__constant__") || t[i].is("__device__") || t[i].is("inline") {
            // Dropped with the space after it; a table's `const` too (see `device_tables`).
            pending.get_or_insert_with(|| t[i].ws.clone());
            i += 1;
            if t[i - 1].is("__constant__") && t.get(i).is_some_and(|x| x.is("const")) {
                i += 1;
            }
            continue;
        } else {
            (1, t[i].text.as_str())
        };
        // A 64-bit literal's `ull` is `ul` in GLSL.
        let text = match text.strip_suffix("ull") {
            Some(digits) if t[i].number() => format!("{digits}ul"),
            _ => text.to_string(),
        };
        out.push(Tok {
            ws: pending.take().unwrap_or_else(|| t[i].ws.clone()),
            text,
        });
        i += n;
    }
    out
}

/// Translates a C body or table text (see the module note).
fn translate(c: &str) -> String {
    let mut t = types(lex(c));
    // Byte pointers: declared `const uint64_t p` (was `const unsigned char* p`), and `row`.
    let mut pointers = vec!["row".to_string(), "b".to_string()];
    for w in t.windows(4) {
        if w[0].is("const") && w[1].is("uint64_t") && w[2].ident() && w[3].is("=") {
            pointers.push(w[2].text.clone());
        }
    }
    // p[i] → aubier_b8(p + (i)), innermost last (a restart per rewrite).
    while let Some(i) =
        (0..t.len().saturating_sub(1)).find(|&i| pointers.contains(&t[i].text) && t[i + 1].is("["))
    {
        let close = closing(&t, i + 1);
        let index: Vec<Tok> = t[i + 2..close].to_vec();
        let mut rep = vec![
            Tok {
                ws: t[i].ws.clone(),
                text: "aubier_b8".into(),
            },
            Tok::new("("),
            Tok::new(&t[i].text),
            Tok::spaced("+"),
            Tok::spaced("("),
        ];
        rep.extend(index);
        rep.extend([Tok::new(")"), Tok::new(")")]);
        t.splice(i..=close, rep);
    }
    // (T)x → T(x).
    const CASTS: [&str; 4] = ["float", "int", "uint", "uint64_t"];
    while let Some(i) = (0..t.len().saturating_sub(3)).find(|&i| {
        t[i].is("(")
            && CASTS.iter().any(|c| t[i + 1].is(c))
            && t[i + 2].is(")")
            && (t[i + 3].ident() || t[i + 3].number() || t[i + 3].is("("))
    }) {
        let end = operand_end(&t, i + 3);
        let mut operand: Vec<Tok> = t[i + 3..end].to_vec();
        let group =
            operand.len() > 1 && operand[0].is("(") && closing(&operand, 0) == operand.len() - 1;
        if !group {
            operand.insert(0, Tok::new("("));
            operand.push(Tok::new(")"));
        }
        operand[0].ws.clear();
        let mut rep = vec![Tok {
            ws: t[i].ws.clone(),
            text: t[i + 1].text.clone(),
        }];
        rep.extend(operand);
        t.splice(i..end, rep);
    }
    // An integer ternary condition c ? … → (c) != 0u ? ….
    let mut i = 0;
    while i < t.len() {
        if t[i].is("?") {
            let mut depth = 0i32;
            let mut start = i;
            while start > 0 {
                let p = &t[start - 1];
                if p.is(")") {
                    depth += 1;
                } else if p.is("(") {
                    if depth == 0 {
                        break;
                    }
                    depth -= 1;
                } else if depth == 0
                    && ["=", ",", ";", "{", "?", ":", "return"]
                        .iter()
                        .any(|s| p.is(s))
                {
                    break;
                }
                start -= 1;
            }
            let mut d = 0;
            let compares = t[start..i].iter().any(|x| {
                if x.is("(") {
                    d += 1;
                } else if x.is(")") {
                    d -= 1;
                }
                d == 0
                    && ["<", ">", "<=", ">=", "==", "!=", "&&", "||", "!"]
                        .iter()
                        .any(|s| x.is(s))
            });
            let grouped = t[start].is("(") && closing(&t, start) == i - 1;
            if !compares {
                t.insert(i, Tok::spaced("0u"));
                t.insert(i, Tok::spaced("!="));
                i += 2;
                if !grouped {
                    let ws = std::mem::take(&mut t[start].ws);
                    t.insert(i - 2, Tok::new(")"));
                    t.insert(
                        start,
                        Tok {
                            ws,
                            text: "(".into(),
                        },
                    );
                    i += 2;
                }
            }
        }
        i += 1;
    }
    // The destination array, out-parameters and f32 locals.
    let mut out: Vec<Tok> = Vec::new();
    let mut carry = None;
    for (i, tok) in t.iter().enumerate() {
        let prev = out.last().map(|p: &Tok| p.text.clone()).unwrap_or_default();
        let mut tok = tok.clone();
        if let Some(ws) = carry.take() {
            tok.ws = ws;
        }
        let tok = &tok;
        if tok.is("out") {
            out.push(Tok {
                ws: tok.ws.clone(),
                text: "dq".into(),
            });
        } else if tok.is("+") && prev == "dq" {
            out.push(Tok::new(","));
        } else if tok.is("&") && (prev == "(" || prev == ",") {
            carry = Some(tok.ws.clone());
        } else if tok.is("const") && t.get(i + 1).is_some_and(|n| n.is("float")) {
            out.push(Tok {
                ws: tok.ws.clone(),
                text: "precise".into(),
            });
            out.push(Tok::spaced("const"));
        } else {
            out.push(tok.clone());
        }
    }
    out.iter().fold(String::new(), |mut s, tok| {
        s.push_str(&tok.ws);
        s.push_str(&tok.text);
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_idioms_become_glsl() {
        let c = "  const unsigned char* q = b + 16 + 32 * (s >> 3);
  const float dl = d * (float)(sc & 15u);
  const unsigned int qh = b[66 + ib];
  out[l] = dl * (float)((q[l] >> shift) & 3) - ml;
  const int high = (hm[l] & m) ? 0 : 4;
  aubier_put_signed(out + 8 * g, 8, db, aubier_iq2xxs_grid[q[l]], (unsigned int)aubier_ksigns_iq2xs[(aux >> (7 * l)) & 127u]);
  aubier_scale_min_k4(2 * r + hi, b + 4, &sc, &mn);
";
        let want = "  const uint64_t q = b + 16 + 32 * (s >> 3);
  precise const float dl = d * float(sc & 15u);
  const uint qh = aubier_b8(b + (66 + ib));
  dq[l] = dl * float((aubier_b8(q + (l)) >> shift) & 3) - ml;
  const int high = (hm[l] & m) != 0u ? 0 : 4;
  aubier_put_signed(dq, 8 * g, 8, db, aubier_iq2xxs_grid[aubier_b8(q + (l))], uint(aubier_ksigns_iq2xs[(aux >> (7 * l)) & 127u]));
  aubier_scale_min_k4(2 * r + hi, b + 4, sc, mn);
";
        // `hm` is not declared in this snippet, so it stays an array.
        assert_eq!(translate(c), want);
        assert_eq!(
            translate("__constant__ const unsigned long long aubier_g[2] = {\n    0x0000000000000001ull, 0x0000000000000002ull,\n};\n"),
            "uint64_t aubier_g[2] = {\n    0x0000000000000001ul, 0x0000000000000002ul,\n};\n"
        );
    }
}
