package tokenizer

// Object is a JSON object that keeps its keys in the order they arrived, as
// the dict that Python's json.loads builds does. Chat templates that print
// request objects with tojson must see that order, so request values are held
// as Objects rather than Go maps.
//
// The values inside an Object (and inside the []any lists it may hold) are
// those of a decoded JSON document: nil, bool, int64 (integer literals that
// fit), float64, string, []any and Object.
type Object []Field

// Field is one key and its value in an Object.
type Field struct {
	Key   string
	Value any
}

// Get returns the value stored under key and whether the key is present.
func (o Object) Get(key string) (any, bool) {
	for _, f := range o {
		if f.Key == key {
			return f.Value, true
		}
	}
	return nil, false
}

// Set replaces the value under key in place, keeping its position, or appends
// the key when it is new (a Python dict assignment does the same).
func (o *Object) Set(key string, value any) {
	for i := range *o {
		if (*o)[i].Key == key {
			(*o)[i].Value = value
			return
		}
	}
	*o = append(*o, Field{Key: key, Value: value})
}

// Delete removes key if present.
func (o *Object) Delete(key string) {
	for i := range *o {
		if (*o)[i].Key == key {
			*o = append((*o)[:i], (*o)[i+1:]...)
			return
		}
	}
}
