package tokenizer

// o200k's letter classes: upper-ish [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and
// lower-ish [\p{Ll}\p{Lm}\p{Lo}\p{M}].
func isUpperish(r rune) bool { return class(r)&(clLu|clLt|clLm|clLo|clM) != 0 }

func isLowerish(r rune) bool { return class(r)&(clLl|clLm|clLo|clM) != 0 }

// optContraction extends a match ending at j by (?i:'s|'t|'re|'ve|'m|'ll|'d)?.
func optContraction(s string, j int) int {
	if j < len(s) && s[j] == '\'' {
		if e := contraction(s, j+1, true); e > 0 {
			return e
		}
	}
	return j
}

// o200kFirst matches [U]*[W]+ then the optional contraction at s[a:]: the
// upper-ish run gives back characters until the lower-ish run can match.
func o200kFirst(s string, a int) int {
	b, lastW := a, -1
	for b < len(s) {
		r, n := decode(s, b)
		if !isUpperish(r) {
			break
		}
		if isLowerish(r) {
			lastW = b + n
		}
		b += n
	}
	if b < len(s) {
		if r, _ := decode(s, b); isLowerish(r) {
			return optContraction(s, runWhile(s, b, isLowerish))
		}
	}
	if lastW < 0 {
		return -1
	}
	return optContraction(s, lastW)
}

// o200kSecond matches [U]+[W]* then the optional contraction at s[a:].
func o200kSecond(s string, a int) int {
	b := runWhile(s, a, isUpperish)
	if b == a {
		return -1
	}
	return optContraction(s, runWhile(s, b, isLowerish))
}

func scanO200K(s string, i int) int {
	r, n := decode(s, i)
	cl := class(r)
	prefix := r != '\r' && r != '\n' && cl&(clL|clN) == 0 && i+n < len(s)
	if prefix {
		if e := o200kFirst(s, i+n); e > 0 {
			return e
		}
	}
	if e := o200kFirst(s, i); e > 0 {
		return e
	}
	if prefix {
		if e := o200kSecond(s, i+n); e > 0 {
			return e
		}
	}
	if e := o200kSecond(s, i); e > 0 {
		return e
	}
	if cl&clN != 0 {
		j := i + n
		for k := 1; k < 3 && j < len(s); k++ {
			r2, n2 := decode(s, j)
			if !isN(r2) {
				break
			}
			j += n2
		}
		return j
	}
	j := -1
	if r == ' ' && i+1 < len(s) {
		if r2, _ := decode(s, i+1); isOther(r2) {
			j = i + 1
		}
	}
	if j < 0 && cl&(clS|clL|clN) == 0 {
		j = i
	}
	if j >= 0 {
		j = runWhile(s, j, isOther)
		return runWhile(s, j, func(r rune) bool { return r == '\r' || r == '\n' || r == '/' })
	}
	return whitespaceTail(s, i)
}
