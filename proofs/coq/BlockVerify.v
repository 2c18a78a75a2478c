(* Block verification (Sun et al., ICLR 2025, Algorithm 2) emits the target's
   law, for context-dependent models.

   p c and q c are the target and draft laws of the next token after the
   context c.  The drafts x_1 .. x_K are sampled from q (eagerly, as
   implemented).  Along the drafted path, with c_i the context after i drafts:
     p_0 = 1,  p_{i+1} = min(1, p_i * p c_i x_{i+1} / q c_i x_{i+1})   (step)
     Z(c_i, p_i) = sum_y max(0, p_i * p c_i y - q c_i y)              (Zm)
     h_i = Z(c_i, p_i) / (Z(c_i, p_i) + 1 - p_i) for 0 < i < K,  h_K = p_K,
   and h_0 = 1.  With independent uniforms eta_i, tau is the largest i with
   eta_i < h_i, which passes with probability h_i.  The round emits
   x_1 .. x_tau and then y drawn from norm(max(0, p_tau * p c_tau - q c_tau))
   if tau < K (from p c_tau when that has no mass), or from p c_K if tau = K.

   G c w h xs cont s below is the probability, over the uniforms, that tau is
   at least the current position (with context c, weight w = p_i, test h and
   the remaining drafts xs) AND the stream (the tokens the round emits from
   this position on, then the process cont) starts with s: tau equals the
   current position when its test passes and no later one does (none);
   otherwise tau is later and the next emitted token is the next draft.  F is
   the same for the emitted chunk alone.  Main results: roundB_AR and
   roundsB_AR (the prefix-law form of Block.v's round_AR and rounds_AR),
   block_speculative_prefix, and block_verification_complete (the form of
   Block.v's chunk_complete). *)

From mathcomp Require Import all_ssreflect all_algebra.
From SpecSample Require Import SeqSum Block.

Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Import GRing.Theory Num.Theory Order.TTheory.
Local Open Scope ring_scope.

Section BlockVerify.

Variable R : realFieldType.
Variable T : finType.
Variables p q : seq T -> T -> R.

Hypothesis p_ge0 : forall c x, 0 <= p c x.
Hypothesis q_ge0 : forall c x, 0 <= q c x.
Hypothesis p_sum1 : forall c, \sum_x p c x = 1.
Hypothesis q_sum1 : forall c, \sum_x q c x = 1.

(* Algorithm 2, line 4: the next weight (x / 0 = 0 in a field). *)
Definition step c w x : R := Num.min 1 (w * p c x / q c x).

(* The residual mass Z and the test h of a position (lines 5-6). *)
Definition Zm c w : R := \sum_y Num.max 0 (w * p c y - q c y).
Definition hB c w : R := Zm c w / (Zm c w + (1 - w)).

(* The residual the final token is drawn from; p c when it has no mass. *)
Definition resB c w y : R :=
  if Zm c w == 0 then p c y else Num.max 0 (w * p c y - q c y) / Zm c w.

(* Probability that the test at the current position and every later test fail. *)
Fixpoint none (c : seq T) (w : R) (xs : seq T) : R :=
  if xs is x :: xs' then (1 - hB c w) * none (rcons c x) (step c w x) xs' else 1 - w.

Fixpoint F (c : seq T) (w h : R) (xs t : seq T) {struct xs} : R :=
  match xs, t with
  | [::], [:: y] => w * p c y
  | x :: xs', [:: y] => h * none (rcons c x) (step c w x) xs' * resB c w y
  | x :: xs', y :: ((_ :: _) as t') =>
      (x == y)%:R * F (rcons c x) (step c w x) (hB (rcons c x) (step c w x)) xs' t'
  | _, _ => 0
  end.

(* The law of the chunk one round of block verification with K drafts emits
   after c: drafts from Q (Block.v), then the test at position 0 is h_0 = 1. *)
Definition chunkB K c t := sumlen K (fun xs => Q q c xs * F c 1 1 xs t).

(* --- one position ---------------------------------------------------------- *)

Lemma step_ge0 c w x : 0 <= w -> 0 <= step c w x.
Proof.
by move=> w0; rewrite /step le_minr ler01 divr_ge0 ?mulr_ge0.
Qed.

Lemma step_le1 c w x : step c w x <= 1.
Proof. by rewrite /step le_minl lexx. Qed.

(* q * min(1, a / q) = min(q, a) for a >= 0, q >= 0 (also at q = 0). *)
Lemma q_step c w x : 0 <= w -> q c x * step c w x = Num.min (q c x) (w * p c x).
Proof.
move=> w0; have a0 : 0 <= w * p c x by rewrite mulr_ge0.
rewrite /step; have [->|qx0] := eqVneq (q c x) 0.
  by rewrite mul0r min_l.
by rewrite minr_pmulr ?q_ge0 // mulr1 mulrCA mulfV // mulr1.
Qed.

Lemma perm1 (a b c d e f : R) : a * b * (c * d * e * f) = a * (c * e * f) * (b * d).
Proof. by rewrite [c * d * e]mulrAC [c * e * d * f]mulrAC mulrACA. Qed.

Lemma perm2 (a b e g : R) : a * b * (e * g) = e * a * (b * g).
Proof. by rewrite mulrACA [e * a]mulrC. Qed.

Lemma sum_pick (f : T -> R) y : \sum_i (i == y)%:R * f i = f y.
Proof.
rewrite (eq_bigr (fun i => if i == y then f i else 0)) => [|i _].
  by rewrite -big_mkcond big_pred1_eq.
by case: eqP => _ /=; rewrite ?mul1r ?mul0r.
Qed.

Lemma max_min (a b : R) : Num.max 0 (a - b) + Num.min b a = a.
Proof.
case: (lerP a b) => h.
  by rewrite max_l ?add0r // subr_le0.
by rewrite max_r ?subrK // subr_ge0 ltW.
Qed.

Lemma Zm_ge0 c w : 0 <= Zm c w.
Proof. by apply: sumr_ge0 => y _; rewrite le_maxr lexx. Qed.

(* sum_x q c x * p_{i+1}(x) = p_i - Z: the mass that passes on. *)
Lemma sum_q_step c w : 0 <= w -> \sum_x q c x * step c w x = w - Zm c w.
Proof.
move=> w0; apply/eqP; rewrite eq_sym subr_eq /Zm -big_split /=.
rewrite -[w in w == _]mulr1 -(p_sum1 c) mulr_sumr; apply/eqP/eq_bigr => x _.
by rewrite q_step // addrC max_min.
Qed.

Lemma mass_out c w : 0 <= w -> \sum_x q c x * (1 - step c w x) = Zm c w + (1 - w).
Proof.
move=> w0; rewrite (eq_bigr (fun x => q c x - q c x * step c w x)); last first.
  by move=> x _; rewrite mulrBr mulr1.
by rewrite sumrB q_sum1 sum_q_step // opprB addrCA.
Qed.

(* The test h solves h * (Z + 1 - p_i) = Z (at 0/0 both sides are 0). *)
Lemma hB_eq c w : w <= 1 -> hB c w * (Zm c w + (1 - w)) = Zm c w.
Proof.
move=> w1; rewrite /hB; have [d0|d0] := eqVneq (Zm c w + (1 - w)) 0.
  rewrite d0 mulr0; apply/esym/eqP; move/eqP: d0.
  by rewrite paddr_eq0 ?Zm_ge0 ?subr_ge0 // => /andP[].
by rewrite divfK.
Qed.

(* h is a probability: the test eta < h passes with probability h. *)
Lemma hB_range c w : w <= 1 -> 0 <= hB c w <= 1.
Proof.
move=> w1; rewrite /hB; have [d0|d0] := eqVneq (Zm c w + (1 - w)) 0.
  by rewrite d0 invr0 mulr0 lexx ler01.
have dpos : 0 < Zm c w + (1 - w).
  by rewrite lt_neqAle eq_sym d0 addr_ge0 ?Zm_ge0 ?subr_ge0.
rewrite divr_ge0 ?Zm_ge0 ?(ltW dpos) //= ler_pdivr_mulr // mul1r.
by rewrite ler_addl subr_ge0.
Qed.

Lemma hB_none c w : w <= 1 -> (1 - hB c w) * (Zm c w + (1 - w)) = 1 - w.
Proof. by move=> w1; rewrite mulrBl mul1r hB_eq // addrC addKr. Qed.

Lemma Zm_resB c w y : Zm c w * resB c w y = Num.max 0 (w * p c y - q c y).
Proof.
rewrite /resB; have [z0|z0] := eqVneq (Zm c w) 0; last by rewrite mulrC divfK.
rewrite z0 mul0r; apply/esym; move: z0; rewrite /Zm => /eqP.
rewrite psumr_eq0 => [/allP /(_ y (mem_index_enum y)) /eqP //|y' _].
by rewrite le_maxr lexx.
Qed.

(* --- the survival of the tests: P(no test from here on passes) = 1 - p_i ----- *)

Lemma sum_none n c w : 0 <= w <= 1 ->
  sumlen n (fun xs => Q q c xs * none c w xs) = 1 - w.
Proof.
elim: n c w => [|n IH] c w /andP[w0 w1] /=; first by rewrite mul1r.
rewrite (eq_bigr (fun x => q c x * (1 - hB c w) * (1 - step c w x))); last first.
  move=> x _; rewrite (@eq_sumlen _ _ n _
    (fun t => q c x * (1 - hB c w) * (Q q (rcons c x) t * none (rcons c x) (step c w x) t))).
    by rewrite sumlenZ IH // step_ge0 ?step_le1.
  by move=> t; rewrite !mulrA [q c x * _ * _]mulrAC.
rewrite (eq_bigr (fun x => (1 - hB c w) * (q c x * (1 - step c w x)))); last first.
  by move=> x _; rewrite mulrA [q c x * _]mulrC.
by rewrite -mulr_sumr mass_out // hB_none.
Qed.

(* --- the law, position by position, by induction on the remaining drafts ----- *)

Lemma F_complete n c w h s :
  0 <= w <= 1 -> h * (Zm c w + (1 - w)) = Zm c w -> size s = n.+1 ->
  \sum_(j < n.+1) sumlen n (fun xs => Q q c xs * F c w h xs (take j.+1 s))
                  * AR p (c ++ take j.+1 s) (drop j.+1 s)
  = w * AR p c s.
Proof.
elim: n c w h s => [|n IH] c w h [|y s] hw hh //.
  by case: s => [|//] _; rewrite big_ord1 /= mul1r !mulr1.
case=> hs; have [w0 w1] := andP hw; rewrite big_ord_recl.
(* tau is this position: the final token is y, from the residual *)
have first : sumlen n.+1 (fun xs => Q q c xs * F c w h xs [:: y]) = Num.max 0 (w * p c y - q c y).
  rewrite /= (eq_bigr (fun x => h * resB c w y * (q c x * (1 - step c w x)))); last first.
    move=> x _; rewrite (@eq_sumlen _ _ n _ (fun t => q c x * (h * resB c w y) *
          (Q q (rcons c x) t * none (rcons c x) (step c w x) t))); last first.
      by move=> t /=; rewrite [_ * _ * resB c w y]mulrAC mulrACA.
    by rewrite sumlenZ sum_none ?step_ge0 ?step_le1 // mulrAC mulrC.
  transitivity (h * resB c w y * \sum_x q c x * (1 - step c w x)); first by rewrite mulr_sumr.
  by rewrite mass_out // mulrAC hh Zm_resB.
have e1 : take (@ord0 n.+1).+1 (y :: s) = [:: y] by rewrite /= take0.
have e2 : drop (@ord0 n.+1).+1 (y :: s) = s by rewrite /= drop0.
rewrite e1 e2 first cats1.
(* tau is later: the next emitted token is the next draft, y *)
set w' := step c w y; set h' := hB (rcons c y) w'.
have later t' : t' != [::] -> sumlen n.+1 (fun xs => Q q c xs * F c w h xs (y :: t'))
     = q c y * sumlen n (fun t => Q q (rcons c y) t * F (rcons c y) w' h' t t').
  case: t' => [//|z t'] _; rewrite /= (bigD1 y) //= big1 ?addr0 => [|x /negbTE xy].
    by rewrite -sumlenZ; apply: eq_sumlen => t; rewrite eqxx mul1r mulrA.
  by rewrite (@eq_sumlen _ _ n _ (fun _ => 0)) ?sumlen0 // => t; rewrite xy mul0r mulr0.
rewrite (eq_bigr (fun j : 'I_n.+1 => q c y *
   (sumlen n (fun t => Q q (rcons c y) t * F (rcons c y) w' h' t (take j.+1 s))
    * AR p (rcons c y ++ take j.+1 s) (drop j.+1 s)))); last first.
  move=> j _; rewrite lift0 [take _ (y :: s)]/= [drop _ (y :: s)]/= later; last by case: (s) hs.
  by rewrite cat_rcons mulrA.
rewrite -big_distrr /= IH ?step_ge0 ?step_le1 ?hB_eq ?step_le1 //.
rewrite mulrA -mulrDl /w' q_step // max_min.
by rewrite mulrA.
Qed.

(* BLOCK VERIFICATION IS EXACT: the chunk one round emits, completed to K + 1
   tokens by sampling from the target, has the target's autoregressive law. *)
Theorem block_verification_complete K c s : size s = K.+1 ->
  \sum_(j < K.+1) chunkB K c (take j.+1 s) * AR p (c ++ take j.+1 s) (drop j.+1 s)
  = AR p c s.
Proof.
move=> hs; rewrite -[RHS]mul1r -(@F_complete K c 1 1 s) ?lexx ?ler01 ?subrr ?addr0 ?mul1r //.
Qed.

(* The accepted prefix: tau >= i with the drafts x_1 .. x_i has probability
   Q(x_1 .. x_i) * p_i (here for i = 1), the quantity Theorem 2 of the written
   proof compares with token-wise verification. *)
Lemma first_accepted n c x : sumlen n (fun t => Q q (rcons c x) t *
    (1 - none (rcons c x) (step c 1 x) t)) = step c 1 x.
Proof.
rewrite (@eq_sumlen _ _ n _ (fun t => Q q (rcons c x) t - Q q (rcons c x) t *
          none (rcons c x) (step c 1 x) t)); last by move=> t; rewrite mulrBr mulr1.
rewrite (@eq_sumlen _ _ n _ (fun t => Q q (rcons c x) t + (-1) *
          (Q q (rcons c x) t * none (rcons c x) (step c 1 x) t))); last first.
  by move=> t; rewrite mulN1r.
by rewrite sumlenD sumlenZ sumQ // sum_none ?step_ge0 ?step_le1 ?ler01 // mulN1r opprB addrC subrK.
Qed.

(* --- the prefix-law form of Block.v: rounds of block verification ----------- *)

(* G c w h xs cont s: probability that tau is at least the current position AND
   the stream (the tokens the round emits from this position on, then the
   process cont from the context the round ends in) starts with s. *)
Fixpoint G (c : seq T) (w h : R) (xs : seq T) (cont : seq T -> seq T -> R) (s : seq T)
    {struct xs} : R :=
  match xs, s with
  | [::], [::] => w
  | [::], y :: s' => w * p c y * cont (rcons c y) s'
  | x :: xs', [::] => 1 - (1 - h) * none (rcons c x) (step c w x) xs'
  | x :: xs', y :: s' =>
      h * none (rcons c x) (step c w x) xs' * resB c w y * cont (rcons c y) s'
      + (x == y)%:R * G (rcons c x) (step c w x) (hB (rcons c x) (step c w x)) xs' cont s'
  end.

(* One round with K drafts from c (h_0 = 1), then cont: its prefix law. *)
Definition roundB K cont c s := sumlen K (fun xs => Q q c xs * G c 1 1 xs cont s).

Lemma none_h c w h : h * (Zm c w + (1 - w)) = Zm c w -> (1 - h) * (Zm c w + (1 - w)) = 1 - w.
Proof. by move=> hh; rewrite mulrBl mul1r hh addrC addKr. Qed.

Lemma G_AR n cont : (forall c s, cont c s = AR p c s) ->
  forall c w h s, 0 <= w <= 1 -> h * (Zm c w + (1 - w)) = Zm c w ->
  sumlen n (fun xs => Q q c xs * G c w h xs cont s) = w * AR p c s.
Proof.
move=> hc; elim: n => [|n IH] c w h [|y s] hw hh; have [w0 w1] := andP hw.
- by rewrite /= mul1r mulr1.
- by rewrite /= hc mul1r mulrA.
- rewrite /= mulr1; transitivity (\sum_x (q c x - (1 - h) * (q c x * (1 - step c w x)))).
    apply: eq_bigr => x _; rewrite (@eq_sumlen _ _ n _ (fun t => q c x * Q q (rcons c x) t
      + (- (q c x * (1 - h))) * (Q q (rcons c x) t * none (rcons c x) (step c w x) t))).
      rewrite sumlenD !sumlenZ sumQ // sum_none ?step_ge0 ?step_le1 // mulr1 mulNr.
      by rewrite mulrAC [_ * (1 - h)]mulrC.
    by move=> t; rewrite mulrBr mulr1 mulNr mulrACA.
  rewrite sumrB q_sum1 -big_distrr /= mass_out // none_h //.
  by rewrite opprB addrCA subrr addr0.
- rewrite /= (eq_bigr (fun x => h * resB c w y * cont (rcons c y) s * (q c x * (1 - step c w x))
      + (x == y)%:R * (q c x * (step c w x * AR p (rcons c x) s)))); last first.
    move=> x _; rewrite (@eq_sumlen _ _ n _ (fun t =>
      q c x * (h * resB c w y * cont (rcons c y) s) *
        (Q q (rcons c x) t * none (rcons c x) (step c w x) t)
      + (x == y)%:R * q c x * (Q q (rcons c x) t *
        G (rcons c x) (step c w x) (hB (rcons c x) (step c w x)) t cont s))).
      rewrite sumlenD !sumlenZ sum_none ?step_ge0 ?step_le1 //.
      rewrite IH ?step_ge0 ?step_le1 ?hB_eq ?step_le1 //.
      congr (_ + _); last by rewrite mulrA.
      by rewrite [LHS]mulrAC [LHS]mulrC.
    by move=> t /=; rewrite mulrDr perm1; congr (_ + _); exact: perm2.
  rewrite big_split /= -big_distrr /= mass_out // sum_pick.
  rewrite hc [h * _ * _ * _]mulrAC [h * _ * _]mulrAC hh Zm_resB mulrA -mulrDl q_step //.
  by rewrite max_min mulrA.
Qed.

(* BLOCK THEOREM (prefix-law form): one round of block verification followed by
   target sampling is target sampling, for every K, context and prefix. *)
Theorem roundB_AR K cont : (forall c s, cont c s = AR p c s) ->
  forall c s, roundB K cont c s = AR p c s.
Proof.
move=> hc c s; rewrite /roundB -[RHS]mul1r; apply: G_AR => //; first by rewrite ler01 lexx.
by rewrite subrr addr0 mul1r.
Qed.

(* Rounds of block verification, each from the prefix emitted so far. *)
Fixpoint roundsB (Ks : seq nat) (cont : seq T -> seq T -> R) :=
  if Ks is K :: Ks' then roundB K (roundsB Ks' cont) else cont.

Theorem roundsB_AR Ks c s : roundsB Ks (AR p) c s = AR p c s.
Proof.
elim: Ks c s => [|K Ks IH] c s //=.
exact: roundB_AR.
Qed.

(* Each round emits at least one token, so the first n+1 tokens of a round
   followed by cont depend on cont only through its first n tokens. *)
Lemma G_agree n cont cont' :
  (forall c s, (size s <= n)%N -> cont c s = cont' c s) ->
  forall xs c w h s, (size s <= n.+1)%N -> G c w h xs cont s = G c w h xs cont' s.
Proof.
move=> hc; elim=> [|x xs IH] c w h [|y s] //= hs; first by rewrite hc.
by rewrite IH ?hc // ltnW.
Qed.

Lemma roundsB_agree Ks n cont cont' :
  (forall c s, (size s <= n)%N -> cont c s = cont' c s) ->
  forall c s, (size s <= size Ks + n)%N -> roundsB Ks cont c s = roundsB Ks cont' c s.
Proof.
elim: Ks n => [|K Ks IH] n hc c s //=; first exact: hc.
move=> hs; apply: eq_sumlen => xs; congr (_ * _); apply: (@G_agree (size Ks + n)) => //.
by move=> c' s' hs'; exact: (IH n hc c' s' hs').
Qed.

(* PURE SPECULATIVE GENERATION with block verification: m rounds (any K per
   round) fix the law of the first m tokens to the target's. *)
Theorem block_speculative_prefix Ks cont : (forall c, cont c [::] = 1) ->
  forall c s, (size s <= size Ks)%N -> roundsB Ks cont c s = AR p c s.
Proof.
move=> h1 c s hs; rewrite -(roundsB_AR Ks c s).
apply: (@roundsB_agree Ks 0) => [c' [|//] _|]; first by rewrite h1.
by rewrite addn0.
Qed.


End BlockVerify.
