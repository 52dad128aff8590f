//! `#[derive(Parameters)]` for brasa-nn: implements `brasa_nn::Parameters` by
//! visiting every field under its name, so a layer's parameters (`Var`
//! fields), buffers (`Tensor` fields), train/eval flag (`Training`) and
//! submodules are found without listing them by hand. A field marked
//! `#[module(skip)]` is left out. Tuple-struct fields are named `0`, `1`, ...
//! The generated code names brasa-nn as the deriving crate depends on it:
//! directly (`brasa-nn`, renamed or not) or through the umbrella `brasa`.
//!
//! ```ignore
//! #[derive(Parameters)]
//! struct Block {
//!     norm: LayerNorm,
//!     proj: Linear,
//!     #[module(skip)]
//!     cache: SomethingElse,
//! }
//! ```

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::quote;
use syn::{parse_macro_input, parse_quote, Data, DeriveInput, Fields, Index};

/// The path of brasa-nn as the deriving crate sees it: `::brasa_nn` (or its
/// renamed name) when it depends on brasa-nn, `::brasa::nn` when it only
/// depends on the umbrella crate.
fn nn_path() -> TokenStream2 {
    use proc_macro_crate::{crate_name, FoundCrate};
    let ident = |name: &str| syn::Ident::new(name, proc_macro2::Span::call_site());
    match crate_name("brasa-nn") {
        // Inside brasa-nn, `extern crate self as brasa_nn;` makes this resolve.
        Ok(FoundCrate::Itself) => quote!(::brasa_nn),
        Ok(FoundCrate::Name(name)) => {
            let name = ident(&name);
            quote!(::#name)
        }
        Err(_) => match crate_name("brasa") {
            Ok(FoundCrate::Name(name)) => {
                let name = ident(&name);
                quote!(::#name::nn)
            }
            Ok(FoundCrate::Itself) => quote!(crate::nn),
            Err(_) => quote!(::brasa_nn),
        },
    }
}

/// Derives `brasa_nn::Parameters`; see the crate docs.
#[proc_macro_derive(Parameters, attributes(module))]
pub fn derive_parameters(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(input).unwrap_or_else(syn::Error::into_compile_error).into()
}

fn expand(mut input: DeriveInput) -> syn::Result<TokenStream2> {
    let fields = match &input.data {
        Data::Struct(data) => &data.fields,
        Data::Enum(data) => {
            return Err(syn::Error::new(
                data.enum_token.span,
                "#[derive(Parameters)] supports structs; implement brasa_nn::Parameters by hand for an enum",
            ))
        }
        Data::Union(data) => {
            return Err(syn::Error::new(data.union_token.span, "#[derive(Parameters)] does not support unions"))
        }
    };

    let mut visits = Vec::new();
    let mut visit_muts = Vec::new();
    let members: Vec<(String, TokenStream2)> = match fields {
        Fields::Named(named) => named
            .named
            .iter()
            .filter(|field| !is_skipped(&field.attrs))
            .map(|field| {
                let ident = field.ident.as_ref().ok_or_else(|| {
                    syn::Error::new_spanned(field, "#[derive(Parameters)]: a named field without a name")
                })?;
                let name = ident.to_string();
                let name = name.strip_prefix("r#").unwrap_or(&name).to_string();
                Ok((name, quote!(#ident)))
            })
            .collect::<syn::Result<_>>()?,
        Fields::Unnamed(unnamed) => unnamed
            .unnamed
            .iter()
            .enumerate()
            .filter(|(_, field)| !is_skipped(&field.attrs))
            .map(|(i, _)| {
                let index = Index::from(i);
                (i.to_string(), quote!(#index))
            })
            .collect(),
        Fields::Unit => Vec::new(),
    };
    for field in fields {
        for attr in &field.attrs {
            if attr.path().is_ident("module") {
                attr.parse_nested_meta(|meta| {
                    if meta.path.is_ident("skip") {
                        Ok(())
                    } else {
                        Err(meta.error("unknown #[module(...)] option: the only one is `skip`"))
                    }
                })?;
            }
        }
    }
    for (name, member) in &members {
        visits.push(quote!(walk.field(#name, &self.#member);));
        visit_muts.push(quote!(walk.field(#name, &mut self.#member)?;));
    }

    let nn = nn_path();
    for param in input.generics.type_params_mut() {
        param.bounds.push(parse_quote!(#nn::Parameters));
    }
    let ident = &input.ident;
    let (impl_generics, type_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics #nn::Parameters for #ident #type_generics #where_clause {
            fn visit(&self, walk: &mut #nn::Walk<'_>) {
                let _ = &walk;
                #(#visits)*
            }
            fn visit_mut(&mut self, walk: &mut #nn::WalkMut<'_>) -> #nn::Result<()> {
                let _ = &walk;
                #(#visit_muts)*
                Ok(())
            }
        }
    })
}

fn is_skipped(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("module") && {
            let mut skip = false;
            let _ = attr.parse_nested_meta(|meta| {
                skip |= meta.path.is_ident("skip");
                Ok(())
            });
            skip
        }
    })
}
