//! `[protocol]` is [`redoubt_core::Config`] itself: the section deserializes straight into it.
//!
//! The core's `Config` derives `Deserialize` but requires every field; a file gives only the
//! options it changes. [`deserialize`] therefore lays the section over the defaults
//! ([`defaults`], serialized): every option the section gives is read from the file (so a wrong
//! type is reported at its line), every option it leaves out is taken from the defaults, and
//! an option that is not a field of `Config` is an error at its line. The fields are never
//! listed here: a field added to the core's `Config` is an option of the file at once.

use redoubt_core::Config;
use serde::de::value::StringDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// The value of every `[protocol]` option the file leaves out.
pub fn defaults() -> Config {
    Config::new(1)
}

/// Deserializes `[protocol]` into a `Config` (for `#[serde(deserialize_with)]`).
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Config, D::Error> {
    deserialize_over(d, &defaults())
}

/// Deserializes a `T` from a table, taking every field the table leaves out from `defaults`.
/// A key that is not a field of `T` (as `defaults` serializes) is an error.
pub(crate) fn deserialize_over<'de, D, T>(d: D, defaults: &T) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Serialize + Deserialize<'de>,
{
    let defaults = toml::Table::try_from(defaults).map_err(de::Error::custom)?;
    T::deserialize(Overlay { inner: d, defaults })
}

/// A deserializer that hands `T` the entries of the inner table, then the defaults of the
/// fields the table did not name.
struct Overlay<D> {
    inner: D,
    defaults: toml::Table,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Overlay<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_map(OverlayVisitor {
            visitor,
            defaults: self.defaults,
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

struct OverlayVisitor<V> {
    visitor: V,
    defaults: toml::Table,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for OverlayVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let fields: Vec<String> = self.defaults.keys().cloned().collect();
        self.visitor.visit_map(OverlayMap {
            inner: map,
            inner_done: false,
            fields,
            seen: BTreeSet::new(),
            defaults: self.defaults.into_iter(),
            pending: None,
        })
    }
}

struct OverlayMap<A> {
    inner: A,
    /// Whether every entry of the inner table has been handed out.
    inner_done: bool,
    /// The fields of `T`: the keys of its serialized defaults.
    fields: Vec<String>,
    /// The keys the inner table named.
    seen: BTreeSet<String>,
    defaults: <toml::Table as IntoIterator>::IntoIter,
    /// The default value of the key handed out last, if it came from the defaults.
    pending: Option<toml::Value>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for OverlayMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        if !self.inner_done {
            // The key is checked while the inner deserializer reads it, so that an unknown
            // one is reported at its position in the file.
            match self.inner.next_key_seed(Field {
                fields: &self.fields,
            })? {
                Some(key) => {
                    self.seen.insert(key.clone());
                    return seed.deserialize(StringDeserializer::new(key)).map(Some);
                }
                None => self.inner_done = true,
            }
        }
        for (key, value) in self.defaults.by_ref() {
            if !self.seen.contains(&key) {
                self.pending = Some(value);
                return seed.deserialize(StringDeserializer::new(key)).map(Some);
            }
        }
        Ok(None)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        match self.pending.take() {
            Some(default) => seed.deserialize(default).map_err(de::Error::custom),
            None => self.inner.next_value_seed(seed),
        }
    }
}

/// Reads a key and refuses one that is not a field, in serde's words for an unknown field.
struct Field<'a> {
    fields: &'a [String],
}

impl<'de> DeserializeSeed<'de> for Field<'_> {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        let key = String::deserialize(d)?;
        if self.fields.contains(&key) {
            return Ok(key);
        }
        let expected: Vec<String> = self.fields.iter().map(|f| format!("`{f}`")).collect();
        Err(de::Error::custom(format_args!(
            "unknown field `{key}`, expected one of {}",
            expected.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        #[serde(default = "defaults", deserialize_with = "deserialize")]
        protocol: Config,
    }

    fn parse(text: &str) -> Result<Config, toml::de::Error> {
        toml::from_str::<File>(text).map(|f| f.protocol)
    }

    #[test]
    fn left_out_options_take_their_defaults() {
        assert_eq!(parse("").unwrap(), defaults());
        assert_eq!(parse("[protocol]\n").unwrap(), defaults());
        let c = parse("[protocol]\nf = 2\nlog_size = 512\ndigest_replies = false\n").unwrap();
        let mut expected = Config::new(2);
        expected.log_size = 512;
        expected.digest_replies = false;
        assert_eq!(c, expected);
    }

    #[test]
    fn every_field_round_trips() {
        let mut c = Config::new(3);
        c.checkpoint_interval = 64;
        c.log_size = 640;
        c.message_bytes_max = 1 << 20;
        c.tentative_execution = false;
        let text = format!("[protocol]\n{}", toml::to_string(&c).unwrap());
        assert_eq!(parse(&text).unwrap(), c);
    }

    #[test]
    fn unknown_and_mistyped_options_are_located() {
        let text = "[protocol]\nf = 1\nlog_sise = 512\n";
        let e = parse(text).unwrap_err();
        assert!(
            e.message()
                .starts_with("unknown field `log_sise`, expected one of"),
            "{e}"
        );
        assert!(e.message().contains("`log_size`"), "{e}");
        assert_eq!(e.span().map(|s| &text[s]), Some("log_sise"));

        let text = "[protocol]\ncheckpoint_interval = \"often\"\n";
        let e = parse(text).unwrap_err();
        assert!(e.message().contains("invalid type"), "{e}");
        assert_eq!(e.span().map(|s| &text[s]), Some("\"often\""));

        let e = parse("protocol = 5\n").unwrap_err();
        assert!(e.message().contains("invalid type"), "{e}");
    }
}
