// Package docs holds no code: its tests check that the Markdown pages keep their promises to
// a reader who follows them from a fresh clone.
//
//   - The README's quick start compiles as it stands, pasted whole into the main.go of a
//     module of its own.
//   - Each example builds and passes its tests when its directory is copied into a module of
//     its own, as the README says it can be.
//   - Every relative link and anchor of every page resolves.
//   - Every command a page shows exists: its scripts, packages, directories, flags and
//     environment variables; and the walkthroughs that talk to the httpapi example run as
//     written on a fresh start.
//   - Each store's package doc shows a snippet, and no package doc points at a docs/ path,
//     which a go doc reader cannot follow.
package docs
