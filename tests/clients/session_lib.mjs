// Helpers shared by the Node session scripts: expansion of the `$repeat` generator used in
// session.json for large file contents, and masking of absolute host paths in tool output.

/** `{"$repeat": UNIT, "count": N, "before": A, "after": B}` -> A + UNIT*N + B; other values unchanged. */
export function expand(value) {
  if (value && typeof value === 'object' && !Array.isArray(value) && '$repeat' in value) {
    return (value.before ?? '') + value.$repeat.repeat(value.count) + (value.after ?? '');
  }
  return value;
}

/** A tool input with every generated field expanded. */
export function expandInput(input) {
  return Object.fromEntries(Object.entries(input).map(([k, v]) => [k, expand(v)]));
}

/** A function replacing each of `roots` (longest first) with `<ROOT>` in strings and text blocks. */
export function maskPaths(roots) {
  const unique = [...new Set(roots.filter(Boolean))].sort((a, b) => b.length - a.length);
  const maskText = (text) => unique.reduce((t, root) => t.split(root).join('<ROOT>'), text);
  return (content) => {
    if (typeof content === 'string') return maskText(content);
    if (Array.isArray(content)) {
      return content.map((block) => (block && typeof block.text === 'string' ? { ...block, text: maskText(block.text) } : block));
    }
    return content;
  };
}
