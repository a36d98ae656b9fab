//! The value types the request bodies are built from, each with the rule it deserializes by and
//! the JSON Schema that states that rule.
//!
//! - [`UInt`] / [`Count`] / [`TopK`]: integers as JSON Schema counts them (`2.0` is the integer 2).
//! - [`TokenIds`]: an array of token ids (u32), refused as a whole with the first bad element named.
//! - [`StrOr`]: a string, or an array / object of another type (`stop`, `content`,
//!   `tool_choice`); the inner value is read through the same deserializer, so its errors keep
//!   their path (`messages[0].content[1].x`).
//! - [`Refused`]: a parameter aubier recognises but does not implement, accepted only at its
//!   default ([`DefaultValue`]); any JSON deserializes, and `super::super::params` refuses the rest
//!   by name.
//!
//! Errors raised here are phrased as a predicate (`must be an integer >= 1, got 0`); the
//! request reader prefixes the field's path (`super::super::params`).

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserialize, Deserializer, IntoDeserializer, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// The integer `x` holds, if any, in `[0, 2^64)`: JSON Schema counts `2.0` as the integer 2.
pub fn integral(x: f64) -> Option<u64> {
    // 2^64: every integral f64 below it converts to u64 exactly.
    const LIMIT: f64 = 18_446_744_073_709_551_616.0;
    (x.fract() == 0.0 && (0.0..LIMIT).contains(&x)).then_some(x as u64)
}

/// The integer `n` holds, if any (see [`integral`]).
pub fn json_uint(v: &Value) -> Option<u64> {
    let n = v.as_number()?;
    n.as_u64().or_else(|| n.as_f64().and_then(integral))
}

/// Reads an integer of at least `min`; other numbers fail with `must be …, got x`.
struct AtLeast(u64);

impl AtLeast {
    fn rule(&self) -> String {
        match self.0 {
            0 => "must be an integer in [0, 2^64)".to_owned(),
            min => format!("must be an integer >= {min}"),
        }
    }

    fn check<E: de::Error>(&self, got: Option<u64>, shown: impl fmt::Display) -> Result<u64, E> {
        got.filter(|&n| n >= self.0)
            .ok_or_else(|| E::custom(format!("{}, got {shown}", self.rule())))
    }
}

impl<'de> Visitor<'de> for AtLeast {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.0 {
            0 => f.write_str("an integer"),
            min => write!(f, "an integer >= {min}"),
        }
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        self.check(Some(v), v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        self.check(u64::try_from(v).ok(), v)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        self.check(integral(v), Value::from(v))
    }

    // Values of another kind get the same message as a wrong number.
    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        self.check(None, Value::from(v))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<u64, E> {
        self.check(None, v)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<u64, A::Error> {
        self.check(None, "an array")
    }

    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<u64, A::Error> {
        self.check(None, "an object")
    }
}

/// An integer in `[0, 2^64)`; integral floats count (`3.0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UInt(pub u64);

impl<'de> Deserialize<'de> for UInt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<UInt, D::Error> {
        d.deserialize_any(AtLeast(0)).map(UInt)
    }
}

impl JsonSchema for UInt {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "UInt".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "integer", "minimum": 0, "maximum": u64::MAX})
    }
}

/// `top_k`: an integer in `[0, 2^64)` (0 is off), or −1, which vLLM's and llama.cpp's servers
/// take for "off" and which is read as 0; integral floats count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopK(pub u64);

impl<'de> Deserialize<'de> for TopK {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TopK, D::Error> {
        let v = Value::deserialize(d)?;
        if v.as_f64() == Some(-1.0) {
            return Ok(TopK(0));
        }
        json_uint(&v).map(TopK).ok_or_else(|| {
            de::Error::custom(format!(
                "must be an integer in [0, 2^64) or -1 (off), got {v}"
            ))
        })
    }
}

impl JsonSchema for TopK {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "TopK".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "integer", "minimum": -1, "maximum": u64::MAX})
    }
}

/// A count: an integer of at least 1 (`max_tokens`, `n`); integral floats count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Count(pub u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Count, D::Error> {
        d.deserialize_any(AtLeast(1)).map(Count)
    }
}

impl JsonSchema for Count {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Count".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "integer", "minimum": 1, "maximum": u64::MAX})
    }
}

/// The served model id: any string deserializes (another id is a 404, not a 400); the schema
/// names the one served (filled in at boot, `super::super::openapi`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct ModelId(pub String);

impl JsonSchema for ModelId {
    fn schema_name() -> Cow<'static, str> {
        "ModelId".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "description": "The served model id."})
    }
}

/// One token id (below the vocabulary size, filled in at boot).
pub struct TokenId;

impl JsonSchema for TokenId {
    fn schema_name() -> Cow<'static, str> {
        "TokenId".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "integer", "minimum": 0, "maximum": u32::MAX})
    }
}

/// The elements of `items` as token ids; `Err` names the first that is not an integer in
/// `[0, 2^32)` as `"'name[i]' is not a token id (u32): v"`.
pub fn token_ids(name: &str, items: &[Value]) -> Result<Vec<u32>, String> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            json_uint(v)
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| format!("'{name}[{i}]' is not a token id (u32): {v}"))
        })
        .collect()
}

/// An array of token ids (`/debug/tokens` `ids`); one bad element refuses the array, naming it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenIds(pub Vec<u32>);

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TokenIds, D::Error> {
        let items = Vec::<Value>::deserialize(d)?;
        token_ids("ids", &items)
            .map(TokenIds)
            .map_err(|e| de::Error::custom(format!("must hold token ids: {e}")))
    }
}

impl JsonSchema for TokenIds {
    fn schema_name() -> Cow<'static, str> {
        "TokenIds".into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "array",
            "minItems": 1,
            "description": "Token ids, used as given (no BOS added); at most the KV capacity \
                (filled in at boot).",
            "items": g.subschema_for::<TokenId>(),
        })
    }
}

/// Most entries of one `logit_bias` (OpenAI's limit: a larger map is a 400 there).
pub const MAX_LOGIT_BIAS: usize = 300;

/// The largest `logit_bias` magnitude (OpenAI: each bias in [-100, 100]).
pub const LOGIT_BIAS_RANGE: f64 = 100.0;

/// `logit_bias`: a JSON object from token ids (decimal strings) to biases, read as sent and
/// checked by `super::super::params`, which names the bad key. Its schema's key pattern is
/// [`decimal_below`] of the vocabulary size, written in at boot (`super::super::openapi::spec`).
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(transparent)]
pub struct LogitBias(pub serde_json::Map<String, Value>);

impl JsonSchema for LogitBias {
    fn schema_name() -> Cow<'static, str> {
        "LogitBias".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "maxProperties": MAX_LOGIT_BIAS,
            "propertyNames": {"pattern": decimal_below(u64::from(u32::MAX) + 1)},
            "additionalProperties": {
                "type": "number",
                "minimum": -LOGIT_BIAS_RANGE,
                "maximum": LOGIT_BIAS_RANGE,
            },
        })
    }
}

/// A regular expression matching exactly the decimals in `[0, n)` written without sign or
/// leading zero (`n ≥ 1`): the shorter numbers, then for each digit of `n − 1` the numbers that
/// share its prefix and are smaller at that digit, then `n − 1` itself.
pub fn decimal_below(n: u64) -> String {
    let max = n.saturating_sub(1).to_string();
    let digits = max.as_bytes();
    let k = digits.len();
    let mut alternatives = Vec::new();
    if k >= 2 {
        alternatives.push("[0-9]".to_owned());
    }
    if k >= 3 {
        alternatives.push(format!("[1-9][0-9]{{1,{}}}", k - 2));
    }
    for i in 0..k {
        let low = if i == 0 && k > 1 { b'1' } else { b'0' };
        if digits[i] > low {
            alternatives.push(format!(
                "{}[{}-{}][0-9]{{{}}}",
                &max[..i],
                low as char,
                (digits[i] - 1) as char,
                k - 1 - i
            ));
        }
    }
    alternatives.push(max);
    format!("^({})$", alternatives.join("|"))
}

/// A string ([`StrOr::Str`], read as `S`: a `String` or a string enum) or an array / object read
/// as `T` ([`StrOr::Other`]).
#[derive(Clone, Debug, PartialEq)]
pub enum StrOr<S, T> {
    /// The string form.
    Str(S),
    /// The array or object form.
    Other(T),
}

struct StrOrVisitor<S, T>(PhantomData<(S, T)>);

impl<'de, S: Deserialize<'de>, T: Deserialize<'de>> Visitor<'de> for StrOrVisitor<S, T> {
    type Value = StrOr<S, T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string, or an array or object of the documented shape")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        S::deserialize(v.into_deserializer()).map(StrOr::Str)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        T::deserialize(SeqAccessDeserializer::new(seq)).map(StrOr::Other)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(StrOr::Other)
    }
}

impl<'de, S: Deserialize<'de>, T: Deserialize<'de>> Deserialize<'de> for StrOr<S, T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrOrVisitor(PhantomData))
    }
}

impl<S: JsonSchema, T: JsonSchema> JsonSchema for StrOr<S, T> {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        format!("StrOr_{}_{}", S::schema_name(), T::schema_name()).into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({"anyOf": [g.subschema_for::<S>(), g.subschema_for::<T>()]})
    }
}

/// How a refused parameter's default is recognised.
#[derive(Clone, Copy, Debug)]
pub enum DefaultValue {
    /// Only `null` (absent).
    Null,
    /// `null` or the count 1; any other integer >= 1 is unsupported, anything else invalid.
    One,
    /// `null` or `false`.
    False,
    /// `null`, `""`, `[]` or `{}`.
    Empty,
    /// `null` or one of these strings.
    OneOf(&'static [&'static str]),
    /// `null` or `["text"]`.
    TextModality,
}

impl DefaultValue {
    /// Whether `v` is this default.
    pub fn holds(self, v: &Value) -> bool {
        match (self, v) {
            (_, Value::Null) => true,
            (DefaultValue::One, v) => json_uint(v) == Some(1),
            (DefaultValue::False, Value::Bool(b)) => !b,
            (DefaultValue::Empty, Value::String(s)) => s.is_empty(),
            (DefaultValue::Empty, Value::Array(a)) => a.is_empty(),
            (DefaultValue::Empty, Value::Object(o)) => o.is_empty(),
            (DefaultValue::OneOf(names), Value::String(s)) => names.contains(&s.as_str()),
            (DefaultValue::TextModality, Value::Array(a)) => {
                a.len() == 1 && a[0].as_str() == Some("text")
            }
            _ => false,
        }
    }

    /// The default in words, for error messages.
    pub fn describe(self) -> String {
        match self {
            DefaultValue::Null => "null".to_owned(),
            DefaultValue::One => "1".to_owned(),
            DefaultValue::False => "false".to_owned(),
            DefaultValue::Empty => "empty".to_owned(),
            DefaultValue::OneOf(names) => names.join(" or "),
            DefaultValue::TextModality => "[\"text\"]".to_owned(),
        }
    }

    /// The JSON Schema of exactly the values [`DefaultValue::holds`] accepts.
    fn schema(self) -> Value {
        let null = serde_json::json!({"type": "null"});
        let alternatives = match self {
            DefaultValue::Null => return null,
            DefaultValue::One => vec![serde_json::json!({"const": 1})],
            DefaultValue::False => vec![serde_json::json!({"const": false})],
            DefaultValue::Empty => vec![
                serde_json::json!({"type": "array", "maxItems": 0}),
                serde_json::json!({"type": "object", "maxProperties": 0}),
                serde_json::json!({"type": "string", "maxLength": 0}),
            ],
            DefaultValue::OneOf(names) => vec![serde_json::json!({"enum": names})],
            DefaultValue::TextModality => vec![serde_json::json!({"const": ["text"]})],
        };
        let mut any = vec![null];
        any.extend(alternatives);
        serde_json::json!({"anyOf": any})
    }
}

/// The default a [`Refused`] parameter is accepted at.
pub trait DefaultOnly {
    /// The default.
    const DEFAULT: DefaultValue;
}

macro_rules! defaults {
    ($($(#[$doc:meta])* $name:ident = $value:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name;

        impl DefaultOnly for $name {
            const DEFAULT: DefaultValue = $value;
        }
    )*};
}

defaults! {
    /// Accepted only as `null`.
    NullDefault = DefaultValue::Null;
    /// Accepted only as `null` or 1.
    OneDefault = DefaultValue::One;
    /// Accepted only as `null` or `false`.
    FalseDefault = DefaultValue::False;
    /// Accepted only as `null` or empty.
    EmptyDefault = DefaultValue::Empty;
    /// `function_call`: `null`, `"none"` or `"auto"`.
    FunctionCallDefault = DefaultValue::OneOf(&["none", "auto"]);
    /// `service_tier`: `null`, `"auto"` or `"default"`.
    ServiceTierDefault = DefaultValue::OneOf(&["auto", "default"]);
    /// `verbosity`: `null` or `"medium"`.
    VerbosityDefault = DefaultValue::OneOf(&["medium"]);
    /// `truncation`: `null` or `"disabled"`.
    DisabledDefault = DefaultValue::OneOf(&["disabled"]);
    /// `modalities`: `null` or `["text"]`.
    TextModalityDefault = DefaultValue::TextModality;
}

/// A parameter recognised but not implemented: any JSON value (absent = `null`), accepted only
/// at `D`'s default (checked by `super::super::params`, which names it).
#[derive(Clone, Debug, PartialEq)]
pub struct Refused<D>(pub Value, PhantomData<D>);

impl<D> Default for Refused<D> {
    fn default() -> Self {
        Refused(Value::Null, PhantomData)
    }
}

impl<D: DefaultOnly> Refused<D> {
    /// The default it is accepted at.
    pub fn default_value(&self) -> DefaultValue {
        D::DEFAULT
    }
}

impl<'de, D> Deserialize<'de> for Refused<D> {
    fn deserialize<De: Deserializer<'de>>(d: De) -> Result<Self, De::Error> {
        Value::deserialize(d).map(|v| Refused(v, PhantomData))
    }
}

impl<D: DefaultOnly> JsonSchema for Refused<D> {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Refused".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        Schema::try_from(D::DEFAULT.schema()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_key_pattern_matches_exactly_the_decimals_below_n() {
        for n in [
            1u64,
            2,
            9,
            10,
            11,
            99,
            100,
            101,
            1000,
            1234,
            131_072,
            1 << 32,
        ] {
            let pattern = decimal_below(n);
            let v = jsonschema::validator_for(&json!({"type": "string", "pattern": pattern}))
                .expect("a valid pattern");
            let near = (0..3000).chain(n.saturating_sub(3000)..n + 3000);
            for x in near {
                assert_eq!(v.is_valid(&json!(x.to_string())), x < n, "{x} against {n}");
            }
            for bad in [
                "", "00", "01", "-1", "+1", " 1", "1 ", "1.0", "1\n", "1e2", "x",
            ] {
                assert!(!v.is_valid(&json!(bad)), "{bad:?} against {n}");
            }
        }
    }

    #[test]
    fn integers_follow_json_schema() {
        let uint = |v: Value| serde_json::from_value::<UInt>(v).map(|u| u.0);
        assert_eq!(uint(json!(3)).unwrap(), 3);
        assert_eq!(uint(json!(3.0)).unwrap(), 3);
        assert_eq!(uint(json!(u64::MAX)).unwrap(), u64::MAX);
        for bad in [
            json!(-1),
            json!(0.5),
            json!(1.8446744073709552e19),
            json!("3"),
        ] {
            let e = uint(bad.clone()).unwrap_err().to_string();
            assert_eq!(e, format!("must be an integer in [0, 2^64), got {bad}"));
        }
        let count = |v: Value| serde_json::from_value::<Count>(v).map(|c| c.0);
        assert_eq!(count(json!(2.0)).unwrap(), 2);
        let e = count(json!(0)).unwrap_err().to_string();
        assert_eq!(e, "must be an integer >= 1, got 0");
        let e = count(json!(-2)).unwrap_err().to_string();
        assert_eq!(e, "must be an integer >= 1, got -2");
    }

    #[test]
    fn each_default_schema_accepts_exactly_its_default() {
        let samples = [
            json!(null),
            json!(1),
            json!(2),
            json!(false),
            json!(true),
            json!(""),
            json!("x"),
            json!([]),
            json!(["text"]),
            json!(["text", "audio"]),
            json!({}),
            json!({"a": 1}),
            json!("none"),
            json!("auto"),
            json!("medium"),
        ];
        for d in [
            DefaultValue::Null,
            DefaultValue::One,
            DefaultValue::False,
            DefaultValue::Empty,
            DefaultValue::OneOf(&["none", "auto"]),
            DefaultValue::TextModality,
        ] {
            let validator = jsonschema::validator_for(&d.schema()).expect("schema");
            for s in &samples {
                assert_eq!(validator.is_valid(s), d.holds(s), "{d:?} {s}");
            }
        }
    }
}
