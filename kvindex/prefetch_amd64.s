#include "textflag.h"

// func prefetchLines(base unsafe.Pointer, at *int, n int)
TEXT ·prefetchLines(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ	base+0(FP), AX
	MOVQ	at+8(FP), BX
	MOVQ	n+16(FP), CX
	TESTQ	CX, CX
	JLE	done
loop:
	MOVQ	(BX), DX
	SHLQ	$4, DX // 16-byte slots
	PREFETCHT0	(AX)(DX*1)
	ADDQ	$8, BX
	DECQ	CX
	JNZ	loop
done:
	RET

// func prefetchPtrs(ptrs []unsafe.Pointer)
TEXT ·prefetchPtrs(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ	ptrs_base+0(FP), BX
	MOVQ	ptrs_len+8(FP), CX
	TESTQ	CX, CX
	JLE	pdone
ploop:
	MOVQ	(BX), DX
	PREFETCHT0	(DX)
	ADDQ	$8, BX
	DECQ	CX
	JNZ	ploop
pdone:
	RET
