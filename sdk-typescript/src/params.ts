/**
 * Tool-call parameters as the JSON the service evaluates. A value with no faithful JSON form
 * (NaN, an infinity, a function, a symbol, a Map, a class instance without `toJSON`, a cycle) is
 * refused with a TypeError, never stringified into something a constraint might wrongly pass.
 */

/** Nesting bound: deeper parameters are refused (the service bounds bodies too). */
export const MAX_DEPTH = 64;

/** `parameters` (an object of parameter names to values) as JSON text; TypeError when it has no JSON form. */
export function parametersJson(parameters: unknown): string {
  if (!isPlainObject(parameters)) {
    throw new TypeError('parameters must be an object of parameter names to values');
  }
  return write(parameters, 'parameters', 0, new Set());
}

/** JSON text for a string (what JSON.stringify writes: lone surrogates escaped). */
export function jsonString(value: string): string {
  return JSON.stringify(value);
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    return false;
  }
  const prototype = Object.getPrototypeOf(value) as unknown;
  return prototype === Object.prototype || prototype === null;
}

function write(value: unknown, where: string, depth: number, open: Set<object>): string {
  if (depth > MAX_DEPTH) {
    throw new TypeError(`${where} is nested more than ${MAX_DEPTH} levels deep`);
  }
  switch (typeof value) {
    case 'string':
      return jsonString(value);
    case 'boolean':
      return value ? 'true' : 'false';
    case 'number':
      if (!Number.isFinite(value)) {
        throw new TypeError(`${where} is not a finite number`);
      }
      return JSON.stringify(value);
    case 'bigint':
      return value.toString(); // an integer as exact as it is
    case 'object':
      break;
    default:
      throw new TypeError(`${where} is of type ${typeof value}, which has no JSON form`);
  }
  if (value === null) {
    return 'null';
  }
  if (open.has(value)) {
    throw new TypeError(`${where} refers to itself`);
  }
  if (value instanceof Date) {
    if (Number.isNaN(value.getTime())) {
      throw new TypeError(`${where} is an invalid date`);
    }
    return jsonString(value.toISOString());
  }
  open.add(value);
  try {
    if (Array.isArray(value)) {
      const items = value.map((item: unknown, index) => {
        if (item === undefined) {
          throw new TypeError(`${where}[${index}] is undefined, which has no JSON form`);
        }
        return write(item, `${where}[${index}]`, depth + 1, open);
      });
      return `[${items.join(',')}]`;
    }
    if (isPlainObject(value)) {
      const members: string[] = [];
      for (const [key, member] of Object.entries(value)) {
        if (member === undefined) {
          continue; // an absent member, as JSON.stringify has it
        }
        members.push(`${jsonString(key)}:${write(member, `${where}.${key}`, depth + 1, open)}`);
      }
      return `{${members.join(',')}}`;
    }
    const toJSON = (value as { toJSON?: unknown }).toJSON;
    if (typeof toJSON === 'function') {
      // a value that says what its JSON is (a decimal type, a URL, ...)
      return write((toJSON as () => unknown).call(value), where, depth + 1, open);
    }
    const kind = (value as object).constructor?.name ?? 'object';
    throw new TypeError(`${where} is a ${kind}, which has no JSON form`);
  } finally {
    open.delete(value);
  }
}
