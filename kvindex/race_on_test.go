//go:build race

package kvindex

const raceEnabled = true
