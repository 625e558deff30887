// Package lockname compiles lock-name templates and renders them injectively.
//
// A template is literal text with placeholders in braces: "tenant:{Tenant.ID}:import:{Kind}".
// In literal text "{{" stands for "{" and "}}" for "}". What a placeholder's key means (a field
// path, a URL parameter, a header) is up to the package that binds it: Template only parses,
// escapes, renders and parses rendered names back, and uses no reflection.
//
// Bind is the glue that package decorators and package middleware share: it binds each key of
// a template to a Source of its value and reports every problem as a *guard.NameError, at
// construction for the template and on each call for the values. CallOptions builds the
// options of their acquisitions.
//
// # Injectivity
//
// Render percent-encodes ("%XX", upper-case hex, byte by byte) every rune of a value that is
//
//   - '%', '{' or '}' (the escape character and Redis Cluster hash-tag braces);
//   - a control character (U+0000–U+001F, U+007F–U+009F) or a byte that is not valid UTF-8;
//   - any rune of the template's literal text that is not a letter or a digit (its
//     separators, such as ':' '.' '/' ' ');
//   - the first rune of each literal that stands between two placeholders, even a letter.
//
// Everything else is copied unchanged, so "orders:{ID}" with ID "A-17" renders "orders:A-17".
// Because the first rune of every inner literal never occurs unescaped in a value, a rendered
// name splits back into its values in exactly one way (Values does it, reading "%XX" as one
// unit): two different value tuples never render the same name. Parse rejects what would
// break that: placeholders with no literal text between them ("{a}{b}"), and inner literal
// text that starts with '%', the escape character. Render rejects empty values.
//
// Rendered names are valid UTF-8 and contain no control characters and no braces besides the
// template's own.
package lockname
