//! Serde types that describe an fpt run: which task, which backbone and how it is
//! initialised, which parameter groups train, and how the trainer runs.
//!
//! This crate has no candle dependency: the CLI, the trainer and (later) the ablation
//! harness all speak these types, and a [`RunSpec`] serialised to JSON is the effective
//! config saved next to every result. Names follow the paper (Lu et al. 2021, §2.2 and
//! App. C): `TrainGroups { input, output, layer_norm, positions, attention, feed_forward }`.
//!
//! One concept per module, every type re-exported at the crate root: `run` ([`RunSpec`],
//! its one constructor and validation), `task` ([`TaskSpec`]), `backbone` ([`BackboneSpec`],
//! [`Init`]), `groups` ([`TrainGroups`], [`Role`]), `model` ([`ModelKind`]), `schedule` ([`TrainSpec`],
//! [`LrSchedule`]), `error` ([`SpecError`]); [`table`] for the paper's tables as data,
//! [`files`] for hashing and atomic writes, [`limits`] for size limits on inputs.

/// Declares a settings struct whose every field is optional: each field is written `name:
/// T` and declared `pub name: Option<T>`, read with `None` for an absent key (unknown keys
/// refused) and written without the unset ones; with
/// `merged` (one's set fields over another's) and `any` (whether any field is set), so a
/// new field cannot be left out of either.
macro_rules! optional_settings {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[doc = $doc:literal])* $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $(
                $(#[doc = $doc])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $field: Option<$ty>,
            )*
        }

        impl $name {
            /// `self` with every field `over` sets replaced.
            pub fn merged(&self, over: &Self) -> Self {
                Self {
                    $($field: over.$field.clone().or_else(|| self.$field.clone()),)*
                }
            }

            /// Whether any field is set.
            pub fn any(&self) -> bool {
                false $(|| self.$field.is_some())*
            }
        }
    };
}

pub mod files;
pub mod limits;
pub mod table;

mod backbone;
mod error;
mod groups;
mod model;
mod run;
mod schedule;
mod task;

pub use backbone::*;
pub use error::*;
pub use groups::*;
pub use model::*;
pub use run::*;
pub use schedule::*;
pub use task::*;

#[cfg(test)]
mod tests {
    use super::table::TaskOverrides;
    use super::ShapeOverrides;

    #[test]
    fn optional_settings_read_write_merge_and_count_every_field() {
        let none = ShapeOverrides::default();
        assert!(!none.any());
        assert_eq!(serde_json::to_string(&none).unwrap(), "{}");
        let a: ShapeOverrides = serde_json::from_str(r#"{"layers": 2, "hidden": 64}"#).unwrap();
        assert_eq!(serde_json::to_string(&a).unwrap(), r#"{"layers":2,"hidden":64}"#);
        let b = ShapeOverrides {
            hidden: Some(32),
            vocab: Some(10),
            ..Default::default()
        };
        let m = a.merged(&b);
        assert_eq!(
            (m.layers, m.hidden, m.vocab, m.heads),
            (Some(2), Some(32), Some(10), None)
        );
        // Every field, set alone, makes `any` hold.
        for (key, value) in [
            ("layers", "1"),
            ("hidden", "1"),
            ("heads", "1"),
            ("positions", "1"),
            ("vocab", "1"),
            ("lstm_residual", "false"),
            ("lstm_positions", "false"),
            ("attention_only", "false"),
        ] {
            let one: ShapeOverrides = serde_json::from_str(&format!("{{\"{key}\": {value}}}")).unwrap();
            assert!(one.any(), "{key}");
        }
        let err = serde_json::from_str::<ShapeOverrides>(r#"{"layer": 2}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `layer`"), "{err}");
        let t: TaskOverrides = serde_json::from_str(r#"{"steps": 5, "lr": 0.01}"#).unwrap();
        let u = t.merged(&TaskOverrides {
            steps: Some(7),
            ..Default::default()
        });
        assert_eq!((u.steps, u.lr, u.seeds), (Some(7), Some(0.01), None));
    }
}
