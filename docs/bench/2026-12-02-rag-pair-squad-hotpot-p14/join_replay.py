"""What if the drafter joined after f x its estimated prefill instead of 2x? (an estimate from run logs)

Run from the repository root: python docs/bench/2026-12-02-rag-pair-squad-hotpot-p14/join_replay.py
"""
import json,re,sys
def load(p): return [json.loads(l) for l in open(p)]
sets={'p14':'docs/bench/2026-12-02-rag-pair-squad-hotpot-p14/runs.jsonl','long15':'docs/bench/2026-12-01-rag-pair-long-fp32/protocol15/runs.jsonl'}
for f in (2,3,4,6):
    for name,p in sets.items():
        rows=load(p); by={(r['dataset'],r['qid'],r['system']):r for r in rows}
        tot_old=tot_new=tot_serial=0; nj=0; ratios_old=[]; ratios_new=[]
        for (ds,q,s),r in by.items():
            if s!='spec_verify': continue
            ser=by[(ds,q,'serial_plain')]['e2e_s']
            pr=r['proposer']; ev=pr.get('drafter_events') or []
            old=r['e2e_s']; new=old
            m=re.search(r'joined at token (\d+) after ([\d.]+)s', ' '.join(ev))
            if m:
                waited=float(m.group(2)); dec=r['decode_s']
                led=pr.get('cost_ledger') or {}
                plain=led.get('plain',{}); pt=(plain['s']/plain['tokens']) if plain.get('tokens') else r['decode_speedup_vs_plain']['plain_step_s']
                d=led.get('drafter',{'s':0,'tokens':0})
                gain=d['s']-d['tokens']*pt   # negative: the drafter's rounds beat plain steps
                post=max(dec-waited,1e-6)
                wnew=waited*f/2
                if wnew>=dec:   # never joins
                    new=old-pr.get('drafter_prefill_s',0)-gain
                    nj+=1
                else:           # joins later: lose the share of drafter gains before wnew
                    share=(wnew-waited)/post
                    new=old - gain*share
            ratios_old.append(old/ser); ratios_new.append(new/ser)
        import statistics as st
        print(f"f={f} {name}: median e2e/serial old {st.median(ratios_old):.3f} new {st.median(ratios_new):.3f}; mean old {st.mean(ratios_old):.3f} new {st.mean(ratios_new):.3f}; answers that would not join {nj}")
